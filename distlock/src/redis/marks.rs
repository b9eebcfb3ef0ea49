//! Marks (durable high-water marks, [`Locker::advance_mark`](crate::Locker::advance_mark)) on Redis: one
//! script on a key without expiry, confirmed by replicas when asked, and the
//! durability warnings logged the first time marks are used.

use std::sync::atomic::Ordering;

use super::acquire::ReplicaAck;
use super::scripts::ADVANCE_MARK_SCRIPT;
use super::{RedisLocker, BACKEND};
use crate::deadline::bounded;
use crate::util::{decode_mark, encode_mark};
use crate::{validate, Error, MarkAdvance, Result};

impl RedisLocker {
    /// [`Locker::advance_mark`](crate::Locker::advance_mark): the mark script, then the replicas' `WAIT`
    /// for a mark that records progress.
    pub(super) async fn raise_mark(&self, name: &str, value: i64) -> Result<MarkAdvance> {
        validate::key(name)?;
        self.report_durability_once();
        let mark_key = self.inner.keys.mark_key(name);
        let (advanced, stored): (u8, String) =
            bounded(BACKEND, "advance_mark", self.inner.operation_bound, async {
                ADVANCE_MARK_SCRIPT
                    .key(&mark_key)
                    .arg(encode_mark(value))
                    .invoke_async(&mut self.connection())
                    .await
                    .map_err(|e| {
                        let unknown = e.is_io_error() || e.is_timeout();
                        let error = self.inner.target.error("advance_mark", e, false);
                        if unknown {
                            error.with_outcome_unknown()
                        } else {
                            error
                        }
                    })
            })
            .await?;
        let decode = |stored: &str| {
            decode_mark(stored).ok_or_else(|| {
                Error::backend(
                    BACKEND,
                    "advance_mark",
                    format!("{mark_key} holds {stored:?}, which distlock did not write"),
                )
            })
        };
        // A first write of 0 or less records no progress: losing it in a
        // failover loses nothing, so it is not waited for. (The cron
        // scheduler peeks at a mark by advancing it to 0, and a job's first
        // peek must not stall on missing replicas.)
        let records_progress = value > 0 || !stored.is_empty();
        if advanced == 1 && records_progress {
            if let Some(ack) = self.inner.replicas {
                self.confirm_mark(name, &mark_key, ack).await?;
            }
        }
        match (advanced, stored.as_str()) {
            (1, "") => Ok(MarkAdvance::Advanced { previous: None }),
            (1, previous) => Ok(MarkAdvance::Advanced {
                previous: Some(decode(previous)?),
            }),
            (_, current) => Ok(MarkAdvance::AlreadyAt {
                current: decode(current)?,
            }),
        }
    }

    /// Waits until `ack.min_replicas` replicas have the mark just advanced
    /// in `mark_key`, under the operation bound. A shortfall, or a `WAIT`
    /// that fails, is an outage whose outcome is unknown: the mark stays
    /// advanced on the master (a mark never goes back), but a failover now
    /// could lose it.
    async fn confirm_mark(&self, name: &str, mark_key: &str, ack: ReplicaAck) -> Result<()> {
        let acknowledged = bounded(BACKEND, "advance_mark", self.inner.operation_bound, async {
            self.wait_for_replicas(mark_key, ack)
                .await
                .map_err(|e| self.inner.target.error("advance_mark", e, true))
        })
        .await?;
        if acknowledged >= ack.min_replicas {
            return Ok(());
        }
        Err(Error::backend(
            BACKEND,
            "advance_mark",
            format!(
                "{}: only {acknowledged} replica(s) acknowledged the mark {name:?} within {:?}, \
                 {} required (min_replicas); the mark stays advanced on the master, but a \
                 failover now could lose it: treat the tick as taken, never as free to run",
                self.inner.target.endpoint, ack.timeout, ack.min_replicas
            ),
        )
        .with_outcome_unknown())
    }

    /// Logs the [durability warnings](crate::Locker::durability_warnings) at
    /// `warn`, the first time marks are used, unless a caller already asked
    /// for them.
    fn report_durability_once(&self) {
        if self.inner.durability_reported.swap(true, Ordering::Relaxed) {
            return;
        }
        for warning in self.durability_report() {
            tracing::warn!(component = "distlock", backend = BACKEND, "{warning}");
        }
    }
}
