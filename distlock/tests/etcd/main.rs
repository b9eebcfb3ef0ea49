//! The etcd backend beyond the shared conformance suite, against real etcd
//! processes test-servers starts: interop with `etcdctl lock` both ways
//! (readers included), a lease lost under a holder, shared locks' key
//! layout, tokens and inspection, election keys (the proclamation in the
//! key, the secret in an owner key), and a three-node cluster losing its
//! leader and its quorum.

mod cluster;
mod election;
mod inspect;
mod interop;
mod nesting;
mod session;
mod shared;
mod waiting;
