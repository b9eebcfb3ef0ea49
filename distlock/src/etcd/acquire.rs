//! The acquire recipe, in the steps of etcd's own
//! `client/v3/concurrency/mutex.go`: reserve the name in this locker, enqueue
//! a key under the session lease, await the turn (no older key in the
//! queue), and grant. A shared lock takes the same steps as
//! `experimental/recipes/rwmutex.go`'s `RLock`: its turn comes once no
//! older *writer's* key is in the queue. Every step that may leave a key
//! behind is undone by the [`Attempt`] guard, at once or in the background.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::owner::{self, SecretAt};
use super::recipe::{self, Enqueued, Role, Token, Turn, WatchFailure, Watched};
use super::session::Session;
use super::{errors, EtcdLocker, Inner, Slot, BACKEND};
use crate::inspect::HolderRecord;
use crate::session_registry::{Busy, Held, Ticket};
use crate::wait::{Acquire, Queue};
use crate::{new_owner_token, Error, Lease, LeaseParts, Result};

/// The first and the largest pause between tries of a background clean-up.
const FIRST_RETRY: Duration = Duration::from_millis(50);
const MAX_RETRY: Duration = Duration::from_secs(1);

impl EtcdLocker {
    /// Reserves `slot` for one attempt of this locker, waiting (woken by
    /// local releases) until `deadline` while another of its attempts or
    /// grants has it; `None` at the deadline. An abandoned attempt still
    /// being cleaned up at the deadline (the cluster is failing) is an
    /// error, not a timeout: whether the key is free is unknown.
    async fn reserve_waiting(
        &self,
        key: &str,
        slot: &Slot,
        deadline: Option<Instant>,
    ) -> Result<Option<Ticket<Slot>>> {
        loop {
            let freed = self.inner.freed.notified();
            tokio::pin!(freed);
            // Registered before looking, so a release in between wakes us.
            freed.as_mut().enable();
            if let Ok(ticket) = self.try_reserve(slot) {
                return Ok(Some(ticket));
            }
            tokio::select! {
                () = freed => {}
                () = crate::deadline::sleep_until(deadline) => {
                    return match self.try_reserve(slot) {
                        Ok(ticket) => Ok(Some(ticket)),
                        Err(Busy::CleaningUp) => Err(cleaning_up(key)),
                        Err(Busy::Contended) => Ok(None),
                    };
                }
            }
        }
    }

    /// Reserves `slot` now, or says why not. A reader's slot is its own,
    /// but it waits, as an exclusive attempt would, while an abandoned
    /// exclusive attempt of this locker on the name is being cleaned up:
    /// that key may still be in the queue, and reading it as a writer
    /// ahead would be an outage answered as contention.
    fn try_reserve(&self, slot: &Slot) -> std::result::Result<Ticket<Slot>, Busy> {
        if let Slot::Reader(name, _) = slot {
            let exclusive = Slot::Exclusive(name.clone());
            if self.inner.registry.state(&exclusive) == Some(Busy::CleaningUp) {
                return Err(Busy::CleaningUp);
            }
        }
        self.inner.registry.reserve(slot.clone())
    }
}

impl Queue for EtcdLocker {
    /// `true`: a reader.
    type Kind = bool;

    /// The recipe in four steps: [reserve](Self::reserve),
    /// [enqueue](Self::enqueue), [await the turn](Self::await_turn),
    /// [grant](Self::grant).
    async fn acquire(&self, request: Acquire<'_, bool>) -> Result<Option<Lease>> {
        let (key, ttl, wait, shared) = (request.key, request.ttl, request.wait, request.kind);
        let name = self.name(key);
        let role = if shared {
            Role::Reader(self.inner.readers.fetch_add(1, Ordering::Relaxed))
        } else {
            Role::Writer
        };
        let slot = Slot::of(name.clone(), role);
        let Some(ticket) = self.reserve(key, &slot, wait).await? else {
            return Ok(None);
        };
        let mut attempt = Attempt {
            inner: self.inner.clone(),
            ticket: Some(ticket),
            written: None,
        };
        let secret = new_owner_token();
        // Read on the caller's task, where its label and campaign scopes are.
        let record = self.inner.holder_record.then(|| HolderRecord::now(ttl));
        let bookkeeping = recipe::contender_value(&secret, record.as_ref());
        // An election candidate's key holds what it proclaims, as Go's
        // `concurrency.Election` writes it, so `etcdctl elect -l` prints
        // that; its secret and record go to its owner key.
        let values = match crate::elect::campaign_value(self.inner.holder_record) {
            Some(proclaimed) if !shared => Values {
                contender: proclaimed,
                owner: Some(bookkeeping),
            },
            _ => Values {
                contender: bookkeeping,
                owner: None,
            },
        };
        let mut queued = self
            .enqueue(key, &slot, ttl, &secret, &values, &mut attempt)
            .await?;
        if !self
            .await_turn(&slot, &mut queued, &secret, wait, &mut attempt)
            .await?
        {
            return Ok(None);
        }
        self.grant(key, slot, ttl, queued, secret, attempt)
            .map(Some)
    }

    fn attempt_bound(&self) -> Duration {
        self.operation_bound()
    }
}

impl EtcdLocker {
    /// Step 1: reserves `slot` for this attempt among this locker's own
    /// attempts and grants: a name's exclusive slot (a second writer's key
    /// under the same lease would be the same key), or a reader's own.
    /// `None` is contention, or when waiting, the deadline.
    async fn reserve(
        &self,
        key: &str,
        slot: &Slot,
        wait: Option<Option<Instant>>,
    ) -> Result<Option<Ticket<Slot>>> {
        match wait {
            None => match self.try_reserve(slot) {
                Ok(ticket) => Ok(Some(ticket)),
                Err(Busy::Contended) => Ok(None),
                Err(Busy::CleaningUp) => Err(cleaning_up(key)),
            },
            Some(deadline) => self.reserve_waiting(key, slot, deadline).await,
        }
    }

    /// Step 2: writes this attempt's key (`values`, and an election
    /// candidate's owner key with it) into the queue of `slot`'s name under
    /// the session lease of `ttl`'s class, arming `attempt` first. A lease
    /// etcd no longer knows is replaced by a new session once; an orphaned
    /// key of this lease (no grant owns it: the slot is reserved) is
    /// deleted and the write tried again once.
    async fn enqueue(
        &self,
        key: &str,
        slot: &Slot,
        ttl: Duration,
        secret: &str,
        values: &Values,
        attempt: &mut Attempt,
    ) -> Result<Queued> {
        let (name, role) = (slot.name(), slot.role());
        let mut renewed_session = false;
        loop {
            let session = self.session(ttl).await?;
            let key_name = role.key(name, session.lease);
            // The owner key an election candidate's key of this name and
            // lease has: an orphan's is deleted with it.
            let owner_key = (role == Role::Writer)
                .then(|| owner::owner_key(&self.inner.prefix, key, session.lease));
            let at = match (&values.owner, &owner_key) {
                (Some(_), Some(owner_key)) => SecretAt::OwnerKey(owner_key.clone()),
                _ => SecretAt::Value,
            };
            let owner_write = match &at {
                SecretAt::OwnerKey(owner_key) => values
                    .owner
                    .as_deref()
                    .map(|value| (owner_key.as_str(), value)),
                SecretAt::Value => None,
            };
            // From here on the key may be written: armed.
            attempt.written = Some(Written {
                key: key_name.clone(),
                secret: secret.to_owned(),
                revision: None,
                session: session.clone(),
                at: at.clone(),
            });
            let enqueued = self
                .inner
                .call(|| {
                    recipe::enqueue(
                        self.inner.kv(),
                        name,
                        role,
                        session.lease,
                        &values.contender,
                        owner_write,
                    )
                })
                .await;
            match enqueued {
                Some(Ok(Enqueued::Written {
                    revision,
                    ahead,
                    fencing,
                })) => {
                    if let Some(written) = attempt.written.as_mut() {
                        written.revision = Some(revision);
                    }
                    return Ok(Queued {
                        session,
                        revision,
                        ahead,
                        fencing,
                        at,
                    });
                }
                Some(Ok(Enqueued::Orphan { revision })) => {
                    // Not written by this attempt: nothing of ours to undo
                    // but the orphan itself, which no grant owns (the
                    // registry reserved the slot).
                    attempt.disarm();
                    tracing::warn!(
                        component = "distlock",
                        backend = BACKEND,
                        key,
                        "deleting an orphaned etcd lock key of this locker's lease"
                    );
                    self.inner
                        .request("acquire", true, || {
                            recipe::delete_orphan(
                                self.inner.kv(),
                                &key_name,
                                revision,
                                owner_key.as_deref(),
                            )
                        })
                        .await?;
                    if renewed_session {
                        return Err(errors::plain(
                            "acquire",
                            format!("{key_name} reappeared after its orphan was deleted"),
                        ));
                    }
                    renewed_session = true;
                }
                Some(Err(error)) if errors::lease_not_found(&error) && !renewed_session => {
                    // The session lease is gone (revoked, or expired before
                    // its keep-alive noticed): nothing was written. Its locks
                    // are lost; try once more on a new session.
                    attempt.disarm();
                    session.lost(
                        &self.inner.registry,
                        "etcd no longer knows the lease",
                        Duration::ZERO,
                    );
                    renewed_session = true;
                }
                Some(Err(error)) => {
                    let unknown = !errors::certainly_not_applied(&error);
                    if unknown {
                        attempt.undo_now().await;
                    } else {
                        attempt.disarm();
                    }
                    return Err(errors::backend(
                        &self.inner.cluster,
                        "acquire",
                        error,
                        unknown,
                    ));
                }
                None => {
                    attempt.undo_now().await;
                    return Err(Error::DeadlineExceeded {
                        backend: BACKEND,
                        operation: "acquire",
                        after: self.inner.request_timeout,
                    });
                }
            }
        }
    }

    /// Step 3: true once no older key that `slot`'s role waits for (any key
    /// for a writer, a writer's for a reader) is ahead of ours in the
    /// queue, with `queued.fencing` set to the grant's token as of then. A
    /// single attempt that is not first leaves the queue (contention); a
    /// waiting one watches the key ahead until it is deleted, or until
    /// `wait`'s deadline (false, the key undone), then checks that ours
    /// outlived the wait.
    async fn await_turn(
        &self,
        slot: &Slot,
        queued: &mut Queued,
        secret: &str,
        wait: Option<Option<Instant>>,
        attempt: &mut Attempt,
    ) -> Result<bool> {
        let (name, role) = (slot.name(), slot.role());
        let revision = queued.revision;
        let ahead = match queued.ahead {
            Some(ahead) => ahead,
            // A nested name's key is older than ours: is one of ours?
            None => match self
                .inner
                .request("acquire", false, || {
                    recipe::turn_of(self.inner.kv(), name, revision, role)
                })
                .await?
            {
                Turn::Wait { .. } => true,
                Turn::Go { fencing } => {
                    queued.fencing = fencing;
                    false
                }
            },
        };
        if !ahead {
            return Ok(true);
        }
        let Some(deadline) = wait else {
            // Not first: leave the queue and report contention.
            attempt.undo_now().await;
            return Ok(false);
        };
        let Some(fencing) = self.wait_turn(name, role, revision, deadline).await? else {
            attempt.undo_now().await;
            return Ok(false);
        };
        queued.fencing = fencing;
        // etcd can hand the lock to a key whose lease expired during the
        // wait: check ours is still there.
        let key_name = role.key(name, queued.session.lease);
        let ours = self
            .inner
            .request("acquire", false, || {
                recipe::still_ours(self.inner.kv(), &key_name, revision, secret, &queued.at)
            })
            .await?;
        if !ours {
            attempt.disarm();
            return Err(errors::plain(
                "acquire",
                format!("{key_name} vanished while waiting: the session lease expired"),
            ));
        }
        Ok(true)
    }

    /// Step 4: nothing our key waits for is ahead, so the lock is ours.
    /// The lease's owner token names the key (its role and session lease),
    /// the key's revision and its secret; the fencing token is the one its
    /// turn came with ([`recipe::fencing_token`]). The registry records the
    /// grant, which fails if the session died meanwhile (its lease took the
    /// key with it).
    fn grant(
        &self,
        key: &str,
        slot: Slot,
        ttl: Duration,
        queued: Queued,
        secret: String,
        mut attempt: Attempt,
    ) -> Result<Lease> {
        let Queued {
            session,
            revision,
            fencing,
            at,
            ..
        } = queued;
        let token = Token {
            lease: session.lease,
            role: slot.role(),
            revision,
            secret,
            in_owner_key: at != SecretAt::Value,
        };
        let key_name = token.key(slot.name());
        let token = token.encode();
        let parts = LeaseParts::unexpiring(key, token.clone(), u64::try_from(fencing).ok(), ttl);
        let lease = Lease::new(
            parts,
            self.inner.leases.get_or_init(|| Arc::new(self.clone())),
        );
        let held = Held {
            owner: token,
            session,
            lost: lease.lost_notifier(),
        };
        if self.inner.registry.grant(slot, held).is_err() {
            // The session died meanwhile: its lease, and so the key, is gone.
            attempt.disarm();
            return Err(errors::plain(
                "acquire",
                format!("the session lease of {key_name} was lost while acquiring"),
            ));
        }
        attempt.granted();
        Ok(lease)
    }

    /// Waits until no key that `role` waits for is ahead of revision
    /// `revision` in `name`'s queue (the grant's fencing token as of then),
    /// or until `deadline` (`None`). A failure still current at the
    /// deadline (the last read or watch failed, and nothing answered since)
    /// is reported as that error, not as a timeout: an outage is not
    /// contention. One that a later read answered is forgotten, so a brief
    /// outage early in a wait does not turn its plain timeout into one.
    async fn wait_turn(
        &self,
        name: &str,
        role: Role,
        revision: i64,
        deadline: Option<Instant>,
    ) -> Result<Option<i64>> {
        let mut watch = self.inner.client.watch_client();
        let mut last_error: Option<Error> = None;
        loop {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return match last_error {
                    Some(error) => Err(error),
                    None => Ok(None),
                };
            }
            let turn = match self
                .inner
                .request("acquire", false, || {
                    recipe::turn_of(self.inner.kv(), name, revision, role)
                })
                .await
            {
                // etcd answers again: whatever failed before is over.
                Ok(turn) => {
                    last_error = None;
                    turn
                }
                Err(error) => {
                    last_error = Some(error);
                    self.pause(deadline).await;
                    continue;
                }
            };
            let (key, read_at) = match turn {
                Turn::Wait { key, at } => (key, at),
                Turn::Go { fencing } => return Ok(Some(fencing)),
            };
            match recipe::wait_deleted(
                &mut watch,
                key,
                read_at,
                deadline,
                self.inner.request_timeout,
            )
            .await
            {
                Ok(Watched::Deleted | Watched::TimedOut) => {}
                Err(failure) => {
                    last_error = Some(match failure {
                        WatchFailure::Etcd(error) => {
                            errors::backend(&self.inner.cluster, "acquire", error, false)
                        }
                        WatchFailure::Canceled(reason) => {
                            errors::plain("acquire", format!("etcd canceled the watch: {reason}"))
                        }
                        WatchFailure::TimedOut => Error::DeadlineExceeded {
                            backend: BACKEND,
                            operation: "acquire",
                            after: self.inner.request_timeout,
                        },
                    });
                    self.pause(deadline).await;
                }
            }
        }
    }

    /// A short pause between tries of a wait step, never past `deadline`.
    async fn pause(&self, deadline: Option<Instant>) {
        let until = crate::deadline::saturating_deadline(Instant::now(), FIRST_RETRY);
        let until = deadline.map_or(until, |d| d.min(until));
        tokio::time::sleep_until(until).await;
    }
}

fn cleaning_up(key: &str) -> Error {
    errors::plain(
        "acquire",
        format!(
            "this locker's abandoned attempt or failed release of {key:?} has not reached etcd yet (it is retried in the background); whether the key is free is unknown until it does"
        ),
    )
}

/// What an acquire writes: the contender key's value, and an election
/// candidate's owner key's (`None` for every other lock).
struct Values {
    contender: String,
    owner: Option<String>,
}

/// An attempt's key, written into the queue: under `session`'s lease, at
/// `revision`; `ahead` says whether a key it waits for is older, when the
/// write could tell (`None`: a nested name's key is older, so ask);
/// `fencing` is the grant's fencing token if its turn is now (set again
/// when the turn comes later); `at` is where its secret is.
struct Queued {
    session: Arc<Session>,
    revision: i64,
    ahead: Option<bool>,
    fencing: i64,
    at: SecretAt,
}

/// A key an attempt may have written.
pub(super) struct Written {
    pub(super) key: String,
    pub(super) secret: String,
    /// Its create revision, once known.
    pub(super) revision: Option<i64>,
    pub(super) session: Arc<Session>,
    /// Where its secret is (an election candidate's owner key is deleted
    /// with it).
    pub(super) at: SecretAt,
}

/// One attempt's reservation of a name, and the key it may have written:
/// dropped while a key may be written (a cancelled future, an error), it
/// deletes that key in the background and only then ends the reservation.
struct Attempt {
    inner: Arc<Inner>,
    ticket: Option<Ticket<Slot>>,
    written: Option<Written>,
}

impl Attempt {
    /// Nothing of this attempt is on the server.
    fn disarm(&mut self) {
        self.written = None;
    }

    /// The lock was granted and recorded: end the reservation only.
    fn granted(mut self) {
        self.written = None;
    }

    /// Deletes the key this attempt may have written, once, bounded by the
    /// request timeout; on failure the drop retries in the background.
    async fn undo_now(&mut self) {
        let Some(written) = &self.written else {
            return;
        };
        let deleted = self
            .inner
            .call(|| {
                recipe::delete_if_ours(
                    self.inner.kv(),
                    &written.key,
                    written.revision,
                    &written.secret,
                    &written.at,
                )
            })
            .await;
        if matches!(deleted, Some(Ok(_))) {
            self.written = None;
        }
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        let Some(ticket) = self.ticket.take() else {
            return;
        };
        let Some(written) = self.written.take() else {
            self.inner.registry.release(ticket);
            self.inner.freed.notify_waiters();
            return;
        };
        self.inner.registry.cleaning_up(ticket.clone());
        delete_in_background(
            self.inner.clone(),
            written,
            Some(ticket),
            "an abandoned attempt's",
        );
    }
}

/// Deletes `written` if it is still ours, in the background
/// ([`delete_until_done`]), then ends `ticket`'s reservation and wakes this
/// locker's waiters. `whose` names the key in the log. Without a runtime
/// nothing can retry the delete: the key lives until its session lease
/// ends, and the reservation ends at once.
pub(super) fn delete_in_background(
    inner: Arc<Inner>,
    written: Written,
    ticket: Option<Ticket<Slot>>,
    whose: &'static str,
) {
    let end = move |inner: &Inner| {
        if let Some(ticket) = ticket {
            inner.registry.release(ticket);
        }
        inner.freed.notify_waiters();
    };
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(component = "distlock", backend = BACKEND, key = written.key, whose,
            "an etcd lock key cannot be deleted without a runtime; it lives until the session lease ends");
        end(&inner);
        return;
    };
    runtime.spawn(async move {
        delete_until_done(&inner, &written).await;
        end(&inner);
    });
}

/// Deletes `key` if it is still ours, retrying with backoff until that is
/// answered or the session ends (its lease takes the key with it).
async fn delete_until_done(inner: &Inner, written: &Written) {
    let Written {
        key,
        secret,
        revision,
        session,
        at,
    } = written;
    let key = key.as_str();
    let mut delay = FIRST_RETRY;
    loop {
        match inner
            .request("release", true, || {
                recipe::delete_if_ours(inner.kv(), key, *revision, secret, at)
            })
            .await
        {
            Ok(_) => return,
            Err(error) if session.is_closed() => {
                tracing::debug!(component = "distlock", backend = BACKEND, key, %error,
                    "stopped deleting an etcd lock key: its session lease ended");
                return;
            }
            Err(error) => {
                tracing::debug!(component = "distlock", backend = BACKEND, key, %error,
                    "deleting an etcd lock key failed; retrying");
                tokio::time::sleep(delay).await;
                delay = delay.saturating_mul(2).min(MAX_RETRY);
            }
        }
    }
}
