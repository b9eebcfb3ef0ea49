//! What the Postgres backend promises beyond the shared contract (which
//! `tests/conformance` checks), on real servers: behaviour on a healthy
//! server, faults of a misbehaving one, a real network partition,
//! shared (reader) locks, and `try_lock_any` as one statement. One
//! binary with a module per area, built with the `postgres` feature only.

#[path = "../common/mod.rs"]
mod common;
mod support;

mod behaviour;
mod faults;
mod hop;
mod inspect;
mod partition;
mod permits;
mod shared;
