//! What the MySQL backend promises beyond the shared contract (which
//! `tests/conformance` checks), on a real MariaDB server: lock names, killed
//! holders and waiters, the connection bound, fencing, TLS, clear errors,
//! and a paused or restarted server. One binary, built with the `mysql`
//! feature only; most tests share one server.

#[path = "../common/mod.rs"]
mod common;
mod support;

mod behaviour;
mod faults;
mod inspect;
mod namespaces;
