//! Leader election over any [`Locker`]: one leader at a time among the
//! candidates of an election, terms that carry fencing tokens, a leader that
//! stops before its term can pass to another, and observers that watch
//! without campaigning.
//!
//! An election is a lock: its name is the lock's key, a **term** is one grant
//! of it, kept alive while the leader leads. Everything a lease guarantees
//! carries over, on every backend and through every wrapper:
//!
//! - **One leader at a time**, as far as the backend's exclusion holds (see
//!   each backend's docs for what it promises under a pause or a partition).
//! - **Terms are numbered by fencing tokens**: [`Term::fencing_token`]
//!   strictly increases across the terms of one election on every backend
//!   with fencing ([`crate::Capabilities::fencing`]). Hand it to whatever the
//!   leader writes to and have that reject a smaller one: that, not the
//!   election alone, stops a paused former leader.
//! - **A leader stops before its term can pass.** [`Election::lead`] runs
//!   the leader's work under the term's lost signal, which fires
//!   [`drift_margin`](crate::drift_margin) before the term's known validity
//!   ends (a refresh that does not come in time) and at once when the backend
//!   says the lease is gone; the work is dropped, and only then is the lock
//!   released, so the next leader is elected after the work stopped. The
//!   release has its own time bound ([`Election::release_timeout`]): it never
//!   rides on a context that is already cancelled.
//! - **A dead leader blocks the election only as long as its lock**: at once
//!   on session backends (file, Postgres, MySQL: the server or kernel drops a
//!   dead process's locks), one ttl on expiring ones (Redis, etcd,
//!   Redlock), and one session timeout on ZooKeeper (the server expires the
//!   dead leader's session; the ttl is not used there). Candidates wait on
//!   the backend's release notification (ZooKeeper: the watch on the node
//!   ahead) where it has one, so a resign hands over in a few round trips.
//!   On ZooKeeper an election is the lock recipe, as Curator's
//!   `LeaderSelector` is (it runs on `InterProcessMutex`).
//! - **Observable**: campaigns, terms begun and ended (with why), their
//!   length and leader changes seen by observers are counted through the
//!   `metrics` facade with the election's name as a label (see
//!   [`describe_metrics`](crate::describe_metrics); keep the number of
//!   election names bounded), and logged through `tracing` (a
//!   `distlock.campaign` span, a line per term).
//! - **The leader proclaims a value** ([`Election::proclaim`]: its address,
//!   for example), recorded as the holder label of its lock, where
//!   [`Observer`]s and `distlock status` read it. On etcd it is also the
//!   whole value of the candidate's key, as Go's `concurrency.Election`
//!   writes it, so `etcdctl elect -l` prints exactly that (see the etcd
//!   backend's docs, `distlock::etcd`: the secret and the record are in a
//!   key beside it). A candidate that proclaims nothing publishes its
//!   holder label there instead (the label in force, see
//!   [`crate::inspect`]), or nothing with holder recording off. A
//!   proclaimed value lasts for the term: there is no `Proclaim` within one
//!   (the holder label is written once, with the grant, on every backend),
//!   so a new value comes with the next term.
//!
//! # Timings
//!
//! With the default [`KeepAlive`], a leader refreshes its term every ttl/3.
//! A refresh that fails is retried until the term would lapse; the leader's
//! work is stopped [`drift_margin`](crate::drift_margin) (ttl/100 + 100 ms)
//! before then. So a leader cut off from an expiring backend stops within
//! ttl − drift_margin of its last successful refresh, and the others can be
//! elected one ttl after it. A ttl of 15 s: refresh every 5 s, a leader that
//! lost the server stops within 14.75 s, a standby takes over after 15 s.
//!
//! ```
//! use std::time::Duration;
//! use distlock::elect::Election;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), distlock::Error> {
//! let locker = distlock::connect("memory://").await?;
//! let election = Election::new(locker.clone(), "scheduler")
//!     .ttl(Duration::from_secs(15))
//!     .proclaim("10.0.0.7:8080");
//!
//! // Wait to lead (here: at most 5 s), then work while leader.
//! let done = election
//!     .lead(Some(Duration::from_secs(5)), |term| async move {
//!         // Pass term.fencing_token with every write the leader makes.
//!         term.fencing_token
//!     })
//!     .await?;
//! assert!(done.value.is_some());
//!
//! // Anybody can ask who leads now, without campaigning.
//! assert!(election.observe().leader().await?.is_none());
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use metrics::{counter, gauge, histogram};
use tracing::Instrument;

use crate::inspect::{self, Holder, MAX_LABEL_LEN};
use crate::lease::DEFAULT_RELEASE_TIMEOUT;
use crate::wait::{self, WaitPolicy};
use crate::with_lock::hold_then_release;
use crate::{Completed, Error, KeepAlive, Lease, Locker, LostReason, LostSignal, Result};

mod observer;

pub use observer::{Leader, Observer, DEFAULT_POLL_INTERVAL};

/// The ttl of a term unless [`Election::ttl`] says otherwise: 15 s, the
/// default lease duration of Kubernetes' controller managers
/// (`--leader-elect-lease-duration`). It is how long a leader that stopped
/// refreshing blocks an election on a backend whose locks expire.
pub const DEFAULT_TERM_TTL: Duration = Duration::from_secs(15);

/// How often, at most, a standby looks whether the leader is gone on a
/// backend that cannot wake it ([`crate::Capabilities::release_wakeup`]):
/// a lock waiter backs off to 200 ms, which would be most of a failover on
/// the file backend, where the kernel frees a dead leader's lock at once.
const STANDBY_POLL: Duration = Duration::from_millis(20);

tokio::task_local! {
    /// Set around a campaign's acquire: what the candidate proclaims
    /// (`None`: nothing). See [`campaign_value`].
    static CAMPAIGN: Option<String>;
}

/// What the acquire running on this task publishes as its lock's value on
/// a backend whose election keys carry the leader's value where the
/// backend's own tools read it (etcd: `etcdctl elect -l` prints the
/// leader key's value). `None` outside a campaign. Inside one: the
/// proclaimed value; else, with holder recording on (`record_holder`), the
/// label in force on this task (what [`Observer`]s report as proclaimed,
/// see [`Leader::proclaimed`]); else nothing (an empty value), since the
/// fallback label is the command line that turning recording off keeps to
/// itself.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
pub(crate) fn campaign_value(record_holder: bool) -> Option<String> {
    CAMPAIGN
        .try_with(|proclaimed| match proclaimed {
            Some(value) => value.clone(),
            None if record_holder => inspect::current_label().to_string(),
            None => String::new(),
        })
        .ok()
}

/// One election: its name (the key of its lock on `locker`) and how its
/// candidates campaign. Cheap to clone; every clone campaigns as the same
/// candidate settings.
///
/// See the [module docs](self) for what a term guarantees.
#[derive(Debug, Clone)]
pub struct Election {
    locker: Arc<dyn Locker>,
    name: String,
    ttl: Duration,
    keepalive: KeepAlive,
    proclaim: Option<String>,
    release_timeout: Duration,
}

impl Election {
    /// The election `name` on `locker`: its candidates contend for the lock
    /// `name`. Defaults: ttl [`DEFAULT_TERM_TTL`], the default
    /// [`KeepAlive`] (refresh every ttl/3, no maximum term),
    /// [`DEFAULT_RELEASE_TIMEOUT`], nothing proclaimed (the lock then records
    /// the process's label, see [`crate::inspect`]).
    ///
    /// `locker` is any [`Locker`]: a backend, a wrapped one, or an
    /// `Arc<dyn Locker>` shared with the rest of the program (kept as it is,
    /// not boxed again).
    pub fn new(locker: impl Locker, name: impl Into<String>) -> Self {
        Election {
            locker: crate::lease::into_shared(locker),
            name: name.into(),
            ttl: DEFAULT_TERM_TTL,
            keepalive: KeepAlive::default(),
            proclaim: None,
            release_timeout: DEFAULT_RELEASE_TIMEOUT,
        }
    }

    /// The ttl of each term's lease: how long a leader that stops refreshing
    /// (paused, cut off) blocks the election on backends whose locks expire.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How a term is kept alive (see [`KeepAlive`]); a
    /// [`max_hold`](KeepAlive::max_hold) ends every term after that long.
    pub fn keep_alive(mut self, keepalive: KeepAlive) -> Self {
        self.keepalive = keepalive;
        self
    }

    /// What this candidate publishes to followers once it leads (its
    /// address, for example): recorded as the holder label of the term's
    /// lock, at most [`MAX_LABEL_LEN`] bytes, and read by [`Observer`]s as
    /// [`Leader::proclaimed`]; on etcd also the value of the candidate's
    /// key, which `etcdctl elect -l` prints (see the [module docs](self)).
    /// Anybody who can inspect the lock reads it: nothing secret belongs in
    /// it.
    pub fn proclaim(mut self, value: impl Into<String>) -> Self {
        self.proclaim = Some(value.into());
        self
    }

    /// Bounds the release that ends a term ([`Term::resign`], the end of
    /// [`lead`](Self::lead)); default [`DEFAULT_RELEASE_TIMEOUT`].
    pub fn release_timeout(mut self, timeout: Duration) -> Self {
        self.release_timeout = timeout;
        self
    }

    /// The election's name: the key of its lock.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits to lead, for at most `timeout` (`None`: for as long as it
    /// takes), and returns the term, kept alive until it is resigned,
    /// dropped or lost.
    ///
    /// Waiting wakes on the backend's release notification or server-side
    /// wait where it has one (see [`Locker::lock`]); elsewhere (the file
    /// backend across processes) it polls at least every 20 ms.
    ///
    /// # Errors
    ///
    /// - [`Error::Timeout`] (or [`Error::NotAcquired`] for a zero timeout) if
    ///   another candidate led for the whole wait;
    /// - [`Error::InvalidInput`] for an empty or oversized name, a ttl the
    ///   backend refuses, or a proclaimed value over [`MAX_LABEL_LEN`] bytes;
    /// - a backend error if the backend failed or did not answer.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe as [`Locker::lock`] is: a campaign dropped while waiting
    /// leaves no term behind (an acquire in flight is undone, or its lock
    /// freed by its ttl or session).
    pub async fn campaign(&self, timeout: Option<Duration>) -> Result<Term> {
        if let Some(value) = &self.proclaim {
            if value.len() > MAX_LABEL_LEN {
                return Err(Error::invalid(
                    "proclaimed value",
                    format!(
                        "{} bytes, over the {MAX_LABEL_LEN} a holder label can hold: \
                         proclaim something shorter (an address, an id)",
                        value.len()
                    ),
                ));
            }
        }
        let span = tracing::info_span!("distlock.campaign", election = %self.name);
        let timeout = timeout.unwrap_or(Duration::MAX);
        let acquire = async {
            match self.locker.capabilities().release_wakeup {
                true => self.locker.lock(&self.name, self.ttl, timeout).await,
                // Nothing wakes a standby (the file backend across
                // processes): it polls, and a failover waits for its next
                // look, so it looks more often than a lock waiter does.
                false => {
                    let policy = WaitPolicy::default().max_delay(STANDBY_POLL);
                    wait::acquire(&*self.locker, &self.name, self.ttl, timeout, &policy).await
                }
            }
        };
        // The campaign scope tells a backend whose election keys carry the
        // leader's value natively (etcd) what to publish there.
        let acquire = CAMPAIGN.scope(self.proclaim.clone(), acquire);
        let acquired = match &self.proclaim {
            Some(value) => {
                inspect::with_label(value.clone(), acquire)
                    .instrument(span)
                    .await
            }
            None => acquire.instrument(span).await,
        };
        let outcome = match &acquired {
            Ok(_) => "elected",
            Err(error) if error.is_contention() => "timeout",
            Err(error) => error.kind_name(),
        };
        counter!("distlock_election_campaigns_total", "election" => self.name.clone(), "outcome" => outcome)
            .increment(1);
        let mut lease = acquired?;
        lease.set_release_timeout(self.release_timeout);
        lease.keep_alive(self.keepalive.clone())?;
        Ok(Term::begin(lease, &self.proclaim))
    }

    /// Campaigns (see [`campaign`](Self::campaign)), runs `work` while this
    /// candidate leads, then resigns: the run-while-leader form.
    ///
    /// `work` gets the term's [`TermInfo`]. It is raced against the term's
    /// lost signal: if the term ends first (the backend says the lease is
    /// gone, its validity is within [`drift_margin`](crate::drift_margin) of
    /// running out, or the keepalive's `max_hold` passed), `work` is dropped,
    /// which stops it, and only then is the lock released, bounded by the
    /// release timeout. The next leader is elected after `work` stopped.
    ///
    /// # Errors
    ///
    /// The campaign's error if this candidate was not elected (`work` does
    /// not run); [`Error::Lost`] if the term ended while `work` ran (`work`
    /// was stopped). Otherwise [`Completed`] with the work's value and how
    /// the resignation went.
    ///
    /// # Cancel safety
    ///
    /// If this future is dropped while `work` runs, `work` is dropped with it
    /// and the term is resigned in the background, bounded by the release
    /// timeout.
    pub async fn lead<F, Fut>(
        &self,
        timeout: Option<Duration>,
        work: F,
    ) -> Result<Completed<Fut::Output>>
    where
        F: FnOnce(TermInfo) -> Fut,
        Fut: Future,
    {
        let term = self.campaign(timeout).await?;
        let work = work(term.info());
        hold_then_release(term.lease, work).await
    }

    /// An observer of this election that does not campaign (see
    /// [`Observer`]).
    pub fn observe(&self) -> Observer {
        Observer::new(self.locker.clone(), self.name.clone())
    }
}

/// One term of leadership: the lease this candidate holds on the election's
/// lock. Resign it with [`resign`](Self::resign); a term dropped without
/// that is resigned in the background, like a dropped [`Lease`].
#[derive(Debug)]
pub struct Term {
    lease: Lease,
    began: SystemTime,
    leader: Holder,
}

/// The plain facts of a term, cheap to clone into the leader's work (see
/// [`Election::lead`]).
#[derive(Debug, Clone)]
pub struct TermInfo {
    /// The election's name.
    pub election: String,
    /// The term's number: its lease's fencing token (see
    /// [`Term::fencing_token`]).
    pub fencing_token: Option<u64>,
    /// When this term began (this host's clock).
    pub began: SystemTime,
    /// Fires when the term ends (see [`Term::lost_signal`]).
    pub lost: LostSignal,
}

impl TermInfo {
    /// The term's number, as [`Term::fencing_token`] spells it: the field,
    /// by the same name as on [`Term`] and [`crate::Lease`].
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing_token
    }
}

impl Term {
    /// A term on the lease just granted; counts it in the metrics and logs
    /// it, and arranges for its end to be counted and logged too.
    fn begin(lease: Lease, proclaim: &Option<String>) -> Term {
        let began = SystemTime::now();
        let leader = match proclaim {
            Some(value) => Holder::this_process(value),
            None => Holder::current(),
        };
        let election = lease.key().to_owned();
        let token = lease.fencing_token();
        tracing::info!(component = "distlock", election = election.as_str(), term = ?token, "elected leader");
        gauge!("distlock_election_leader", "election" => election.clone()).set(1.0);
        let started = tokio::time::Instant::now();
        lease.on_end(move |reason| {
            gauge!("distlock_election_leader", "election" => election.clone()).set(0.0);
            histogram!("distlock_election_term_duration_seconds", "election" => election.clone())
                .record(started.elapsed().as_secs_f64());
            let ended = match reason {
                LostReason::Released => "resigned",
                lost => crate::metrics::reason_name(lost),
            };
            counter!("distlock_election_terms_ended_total", "election" => election.clone(), "reason" => ended)
                .increment(1);
            match reason {
                LostReason::Released => {
                    tracing::info!(component = "distlock", election = election.as_str(), term = ?token, "resigned leadership")
                }
                lost => {
                    tracing::warn!(component = "distlock", election = election.as_str(), term = ?token, reason = %lost, "leadership lost")
                }
            }
        });
        Term {
            lease,
            began,
            leader: leader_without_zero(leader),
        }
    }

    /// The election's name.
    pub fn election(&self) -> &str {
        self.lease.key()
    }

    /// The term's number: its lease's fencing token, strictly increasing
    /// across the terms of one election; `None` on a backend (as
    /// configured) without fencing (see [`Lease::fencing_token`]).
    pub fn fencing_token(&self) -> Option<u64> {
        self.lease.fencing_token()
    }

    /// When this term began (this host's clock).
    pub fn began(&self) -> SystemTime {
        self.began
    }

    /// Who leads in this term: this process, with the proclaimed value as
    /// its label.
    pub fn leader(&self) -> &Holder {
        &self.leader
    }

    /// Fires when the term ends: resigned, or lost (see [`LostSignal`]).
    /// Work that must not outlive the term races against
    /// [`run_while_leader`](Self::run_while_leader) instead, which stops it
    /// a drift margin early.
    pub fn lost_signal(&self) -> LostSignal {
        self.lease.lost_signal()
    }

    /// Whether the term is known to have ended.
    pub fn is_lost(&self) -> bool {
        self.lease.is_lost()
    }

    /// The term's facts for the leader's work.
    pub fn info(&self) -> TermInfo {
        TermInfo {
            election: self.election().to_owned(),
            fencing_token: self.fencing_token(),
            began: self.began,
            lost: self.lost_signal(),
        }
    }

    /// The lease behind the term (its owner token, ttl and validity), for
    /// what the election does not cover itself: `distlock elect` supervises
    /// a command under it.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Runs `work` until it finishes, or until the term ends, whichever is
    /// first (see [`Lease::run_while_held`]): the end counts
    /// [`drift_margin`](crate::drift_margin) early, so dropped work has
    /// stopped before the next term can begin.
    ///
    /// # Errors
    ///
    /// The [`LostReason`] if the term ended first (`work` was dropped).
    ///
    /// # Cancel safety
    ///
    /// Dropping this future drops `work`; the term goes on.
    pub async fn run_while_leader<F: Future>(
        &self,
        work: F,
    ) -> std::result::Result<F::Output, LostReason> {
        self.lease.run_while_held(work).await
    }

    /// Ends the term: releases the election's lock, bounded by the release
    /// timeout, so the next candidate can be elected. Stop the leader's work
    /// first.
    ///
    /// # Errors
    ///
    /// As [`Lease::release`]: [`Error::NotHeld`] if the term had already
    /// been lost (nothing was released), a backend error or
    /// [`Error::DeadlineExceeded`] if the release failed (the lock is then
    /// freed by its ttl or session).
    ///
    /// # Cancel safety
    ///
    /// A dropped resignation goes on in the background, like a dropped
    /// lease's release.
    pub async fn resign(self) -> Result<()> {
        self.lease.release().await
    }
}

/// The holder as the backends record it: a zero byte in a label is stored
/// as U+FFFD by the SQL backends, so the term says the same.
fn leader_without_zero(mut holder: Holder) -> Holder {
    if holder.label.contains('\0') {
        holder.label = holder.label.replace('\0', "\u{fffd}");
    }
    holder
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryLocker;
    use crate::LockerExt;

    fn election(name: &str) -> Election {
        Election::new(MemoryLocker::new().shared(), name).ttl(Duration::from_secs(5))
    }

    #[tokio::test]
    async fn a_term_reports_its_election_number_and_proclaimed_leader() {
        let election = election("jobs").proclaim("10.0.0.7:8080");
        let term = election
            .campaign(Some(Duration::ZERO))
            .await
            .expect("elected");
        assert_eq!(term.election(), "jobs");
        assert!(term.fencing_token().is_some(), "memory has fencing");
        assert_eq!(term.leader().label, "10.0.0.7:8080");
        assert_eq!(term.leader().pid, std::process::id());
        assert!(term.began() <= SystemTime::now());
        assert!(!term.is_lost());
        term.resign().await.expect("resign");
    }

    #[tokio::test]
    async fn a_second_candidate_waits_out_its_timeout() {
        let first = election("jobs");
        let second = first.clone();
        let term = first.campaign(None).await.expect("elected");
        let refused = second
            .campaign(Some(Duration::from_millis(50)))
            .await
            .expect_err("the first candidate leads");
        assert!(matches!(refused, Error::Timeout { .. }), "{refused:?}");
        term.resign().await.expect("resign");
        let next = second
            .campaign(Some(Duration::ZERO))
            .await
            .expect("free now");
        next.resign().await.expect("resign");
    }

    #[tokio::test]
    async fn an_oversized_proclaimed_value_is_refused_before_campaigning() {
        let election = election("jobs").proclaim("x".repeat(MAX_LABEL_LEN + 1));
        let refused = election.campaign(None).await.expect_err("too long");
        let message = refused.to_string();
        assert!(message.contains("proclaimed value"), "{message}");
        assert!(message.contains("257 bytes"), "{message}");
    }

    #[tokio::test]
    async fn lead_stops_the_work_when_the_term_is_lost_and_frees_the_election() {
        let locker = MemoryLocker::new();
        // A short ttl: the keepalive's next refresh, a third of it, finds
        // the eviction.
        let election =
            Election::new(locker.clone().shared(), "jobs").ttl(Duration::from_millis(600));
        let lost = election
            .lead(None, |term| {
                let locker = locker.clone();
                async move {
                    // An operator evicts the leader.
                    locker
                        .force_release(&term.election, inspect::ForceRelease::Lock)
                        .await
                        .expect("force release");
                    std::future::pending::<()>().await
                }
            })
            .await
            .expect_err("the term was lost");
        assert!(
            matches!(
                lost,
                Error::Lost {
                    reason: LostReason::NotHeld,
                    ..
                }
            ),
            "{lost:?}"
        );
        let next = election.campaign(Some(Duration::ZERO)).await.expect("free");
        next.resign().await.expect("resign");
    }
}
