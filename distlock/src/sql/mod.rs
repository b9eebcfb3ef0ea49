//! The machinery every SQL session-lock backend shares, written once.
//!
//! A SQL backend (Postgres advisory locks, MySQL `GET_LOCK`) holds each lock
//! on a server session that distlock keeps open, many locks per session.
//! What differs between servers is small: how a session is opened and
//! driven, the SQL text that tries, waits for, releases and confirms a
//! lock, how a key becomes the server's lock identity, and how identifiers
//! are quoted. That part is the backend's *dialect*; the rest lives here:
//!
//! - [`pool`]: the shared sessions and the capped waiter connections, over
//!   a dialect's [`Connector`](pool::Connector);
//! - [`core`](self::core): the pool and the registry of held locks, and
//!   the acquire, release and verify steps that do not depend on the SQL;
//! - [`dialect`]: what a backend must say ([`Dialect`](dialect::Dialect)),
//!   and the one [`Locker`](crate::Locker) implementation over it, for
//!   every view of a locker's keys ([`SqlKeys`](dialect::SqlKeys));
//! - [`fencing`]: the fencing table's name, checked and quoted by the
//!   dialect's [`Identifiers`](fencing::Identifiers).
//!
//! Which locks a locker holds, on which session, lives in
//! [`session_registry`](crate::session_registry), shared with etcd.
//!
//! # Adding a SQL backend
//!
//! A new server (SQL Server's `sp_getapplock`, Oracle's `DBMS_LOCK`) is a
//! folder like `postgres/` or `mysql/` holding only its driver session, its
//! SQL text, its key mapping, TLS and error mapping: implement
//! [`Connector`](pool::Connector) and [`PooledSession`](pool::PooledSession)
//! for its session, [`Identifiers`](fencing::Identifiers) for its
//! identifier rules, [`Dialect`](dialect::Dialect) for its locker state
//! and [`SqlKeys`](dialect::SqlKeys) for its locker type, which is then a
//! [`Locker`](crate::Locker).

pub(crate) mod core;
pub(crate) mod dialect;
pub(crate) mod fencing;
pub(crate) mod pool;
