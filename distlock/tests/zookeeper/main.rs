//! The ZooKeeper backend beyond the shared conformance suite, against real
//! ZooKeeper processes test-servers starts: the server killed, restarted
//! and frozen under a holder, a three-server ensemble losing a server and
//! its quorum, a holder process SIGKILLed, and interop with
//! kazoo's `Lock`, `ReadLock` and `WriteLock` both ways, and shared locks'
//! forced release and session loss, `refresh_many` as multi reads, and a
//! locker's sessions.

mod ensemble;
mod faults;
mod interop;
mod refresh;
mod sessions;
mod shared;
