//! What the Redis backend promises beyond the shared contract (which
//! `tests/conformance` checks), on real redis-servers each test starts:
//! configuration and authentication, the circuit breaker over a dying
//! server, faults, the native permit attempt, release notifications, Redis Cluster (slot migration, a
//! killed master), Sentinel (a failover), replica acknowledgement and shared
//! (reader) locks. One binary with a module per
//! area, built with the `redis` feature only.

#[path = "../common/mod.rs"]
mod common;
mod support;

#[cfg(feature = "redlock")]
mod acl;
mod breaker;
mod cluster;
mod config;
mod durability;
mod eviction;
mod faults;
mod inspect;
mod interop;
mod permits;
#[cfg(feature = "redlock")]
mod redlock;
mod replicas;
mod sentinel;
mod shared;
#[cfg(feature = "redlock")]
mod tls;
mod wakeup;
