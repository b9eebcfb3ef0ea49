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

use super::{acquire, errors, recipe, Inner, ZooKeeperLocker};
use crate::util::{decode_mark, encode_mark, StoredMark};
use crate::{validate, MarkAdvance, Result};

impl ZooKeeperLocker {
    /// [`Locker::advance_mark`](crate::Locker::advance_mark): the
    /// compare-and-set of [`advance`] on the mark's node, the values
    /// decoded.
    pub(super) async fn raise_mark(&self, name: &str, value: i64) -> Result<MarkAdvance> {
        validate::key(name)?;
        let path = format!(
            "{}{}{}",
            self.inner.prefix,
            recipe::escape(name),
            recipe::MARK_SUFFIX
        );
        let session = self.inner.session(name).await?;
        let client = session
            .client()
            .ok_or_else(|| acquire::session_gone("advance_mark", &session))?;
        advance(&self.inner, &client, &path, value)
            .await?
            .decode(&path)
            .map_err(|message| errors::plain("advance_mark", message))
    }
}

/// How often a concurrent writer may send us round again. Each round ends
/// with someone's write succeeding, so only a stream of ever higher
/// concurrent values exhausts it.
const ROUNDS: usize = 16;

/// Raises the mark at `path` to `value` if it is lower or absent.
async fn advance(inner: &Inner, client: &zk::Client, path: &str, value: i64) -> Result<StoredMark> {
    let encoded = encode_mark(value);
    // A write ZooKeeper did not refuse for certain may have been applied.
    let write_failed = |error| errors::backend(&inner.ensemble, "advance_mark", error, true);
    for _ in 0..ROUNDS {
        let read = inner.call(client.get_data(path)).await;
        match read {
            Some(Ok((data, stat))) => {
                let current = String::from_utf8_lossy(&data).into_owned();
                // Not ours to overwrite: reported (as an error) by the caller.
                if decode_mark(&current).is_none_or(|stored| stored >= value) {
                    return Ok(StoredMark::AlreadyAt { current });
                }
                match inner
                    .call(client.set_data(path, encoded.as_bytes(), Some(stat.version)))
                    .await
                {
                    Some(Ok(_)) => {
                        return Ok(StoredMark::Advanced {
                            previous: Some(current),
                        })
                    }
                    Some(Err(zk::Error::BadVersion | zk::Error::NoNode)) => continue,
                    Some(Err(error)) => return Err(write_failed(error)),
                    None => return Err(unknown(inner)),
                }
            }
            Some(Err(zk::Error::NoNode)) => {
                let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
                match inner
                    .call(client.create(path, encoded.as_bytes(), &persistent))
                    .await
                {
                    Some(Ok(_)) => return Ok(StoredMark::Advanced { previous: None }),
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
                    Some(Err(error)) => return Err(write_failed(error)),
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
    errors::plain(
        "advance_mark",
        format!(
            "{}: no answer to a mark's write within {:?}; it may have been applied",
            inner.ensemble, inner.request_timeout
        ),
    )
    .with_outcome_unknown()
}
