//! The shared contract, checked on every backend: one module per backend runs
//! `distlock::conformance_suite!` (which expands one `#[tokio::test]` per
//! check, named after it, so each backend needs a module of its own), and
//! `observability` checks what the metrics and tracing wrappers emit.
//!
//! One binary for all of them, as ripgrep's `tests/tests.rs` groups its
//! integration tests: one link instead of one per backend. The Redis and
//! Postgres modules start their own servers (test-servers) and are built
//! with their backend's feature only.

#[cfg(feature = "etcd")]
mod etcd;
mod file;
mod memory;
#[cfg(feature = "mysql")]
mod mysql;
mod observability;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "redis")]
mod redis_cluster;
#[cfg(feature = "redis")]
mod redis_sentinel;
#[cfg(feature = "redlock")]
mod redlock;
#[cfg(feature = "zookeeper")]
mod zookeeper;
#[cfg(feature = "zookeeper")]
mod zookeeper_ensemble;
