//! The `distlock` binary end to end: real processes, real signals, real
//! servers (test-servers). One test binary with a module per backend, as
//! ripgrep's `tests/tests.rs` groups its integration tests, so the CLI's
//! tests link once.

mod support;

mod bench;
mod conventions;
mod cron;
mod elect;
// Each test is gated on the backend it needs; the cron, TOML and file
// ones need none.
mod errors;
#[cfg(feature = "etcd")]
mod etcd;
mod file;
#[cfg(feature = "redis")]
mod inspect;
mod limit;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "redlock")]
mod redlock;
mod shared;
#[cfg(feature = "zookeeper")]
mod zookeeper;
