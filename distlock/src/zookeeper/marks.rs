//! Durable marks ([`crate::Locker::advance_mark`]) on ZooKeeper: one
//! persistent node per mark, raised by compare-and-set.
//!
//! The node is `<key prefix><escaped name>%mark`, beside the lock paths (a
//! `%` followed by a letter never comes out of a key's escaping, so no lock
//! path is a mark's). Its data is [`encode_mark`]'s text. A raise reads the
//! node (data and version) and writes it back with `setData` at that
//! version, which ZooKeeper refuses (`BadVersion`) if anyone wrote it in
//! between; a missing node is created, which ZooKeeper refuses
//! (`NodeExists`) if someone created it first. Either refusal reads again.

use zookeeper_client::{self as zk, Acls, CreateMode};

use super::{errors, Inner};
use crate::util::{decode_mark, encode_mark};
use crate::Result;

/// What the compare-and-set found, values still encoded.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Raw {
    Advanced { previous: Option<String> },
    AlreadyAt { current: String },
}

/// How often a concurrent writer may send us round again. Each round ends
/// with someone's write succeeding, so only a stream of ever higher
/// concurrent values exhausts it.
const ROUNDS: usize = 16;

/// Raises the mark at `path` to `value` if it is lower or absent.
pub(super) async fn advance(
    inner: &Inner,
    client: &zk::Client,
    path: &str,
    value: i64,
) -> Result<Raw> {
    let encoded = encode_mark(value);
    for _ in 0..ROUNDS {
        let read = inner.call(client.get_data(path)).await;
        match read {
            Some(Ok((data, stat))) => {
                let current = String::from_utf8_lossy(&data).into_owned();
                // Not ours to overwrite: reported (as an error) by the caller.
                if decode_mark(&current).is_none_or(|stored| stored >= value) {
                    return Ok(Raw::AlreadyAt { current });
                }
                match inner
                    .call(client.set_data(path, encoded.as_bytes(), Some(stat.version)))
                    .await
                {
                    Some(Ok(_)) => {
                        return Ok(Raw::Advanced {
                            previous: Some(current),
                        })
                    }
                    Some(Err(zk::Error::BadVersion | zk::Error::NoNode)) => continue,
                    Some(Err(error)) => {
                        return Err(errors::backend(
                            &inner.ensemble,
                            "advance_mark",
                            error,
                            true,
                        ))
                    }
                    None => return Err(unknown(inner)),
                }
            }
            Some(Err(zk::Error::NoNode)) => {
                let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
                match inner
                    .call(client.create(path, encoded.as_bytes(), &persistent))
                    .await
                {
                    Some(Ok(_)) => return Ok(Raw::Advanced { previous: None }),
                    Some(Err(zk::Error::NodeExists)) => continue,
                    Some(Err(zk::Error::NoNode)) if !inner.parent.is_empty() => {
                        inner
                            .request(
                                "advance_mark",
                                true,
                                client.mkdir(&inner.parent, &persistent),
                            )
                            .await?;
                    }
                    Some(Err(error)) => {
                        return Err(errors::backend(
                            &inner.ensemble,
                            "advance_mark",
                            error,
                            true,
                        ))
                    }
                    None => return Err(unknown(inner)),
                }
            }
            Some(Err(error)) => {
                return Err(errors::backend(
                    &inner.ensemble,
                    "advance_mark",
                    error,
                    false,
                ))
            }
            None => return Err(errors::deadline("advance_mark", inner.request_timeout)),
        }
    }
    Err(errors::plain(
        "advance_mark",
        format!("{path} was changed by another client on each of {ROUNDS} tries"),
    ))
}

/// A write whose answer did not come in time: it may have been applied.
fn unknown(inner: &Inner) -> crate::Error {
    crate::Error::Backend {
        backend: super::BACKEND,
        operation: "advance_mark",
        outcome_unknown: true,
        source: Box::new(errors::Plain(format!(
            "{}: no answer to a mark's write within {:?}; it may have been applied",
            inner.ensemble, inner.request_timeout
        ))),
    }
}
