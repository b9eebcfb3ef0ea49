//! Watching an election without campaigning: who leads now, and each change.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use futures_util::Stream;
use metrics::counter;
use tokio::time::Instant;

use crate::inspect::{HeldLock, Holder};
use crate::{Locker, ReleaseWatch, Result};

/// How often an observer asks who leads, unless
/// [`Observer::poll_interval`] says otherwise. Backends with release
/// notifications (memory, file, Redis, Redlock) also wake it at once when a
/// leader resigns.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(250);

/// After a release notification, or while nobody leads, the observer looks
/// again this soon (doubling up to its poll interval): a resign is usually
/// followed by the next leader's grant within a few round trips.
const QUICK_LOOK: Duration = Duration::from_millis(10);

/// How many more looks an observer takes at a leader it knows nothing of
/// (no term, no holder) before reporting it: 10 + 20 + ... + 50 ms.
const UNKNOWN_LOOKS: u32 = 5;

/// The leader of an election as an observer sees it: what the lock's
/// inspection reports ([`Locker::inspect`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The term's number, its fencing token; `None` on a backend without
    /// fencing.
    pub term: Option<u64>,
    /// Who leads: host, process id and label; `None` where the leader
    /// records no holder (recording switched off, or a leader that is not
    /// distlock: `etcdctl lock`).
    pub holder: Option<Holder>,
    /// What the leader proclaimed ([`Election::proclaim`](super::Election::proclaim)),
    /// or its process label if it proclaimed nothing: the holder's label;
    /// for a leader that is not distlock, the value it wrote (an `etcdctl
    /// elect` candidate's proposal, see [`HeldLock::value`]).
    pub proclaimed: Option<String>,
    /// When its term began, as the backend recorded it.
    pub since: Option<SystemTime>,
    /// How long its term lasts without another refresh, where the backend
    /// says (at the time of the inspection).
    pub ttl_left: Option<Duration>,
}

impl Leader {
    fn from_held(held: HeldLock) -> Leader {
        Leader {
            term: held.fencing_token,
            proclaimed: held
                .holder
                .as_ref()
                .map(|holder| holder.label.clone())
                .or(held.value),
            holder: held.holder,
            since: held.granted.map(|granted| granted.at),
            ttl_left: held.ttl_left,
        }
    }

    /// Whether `self` and `other` are the same term: the same fencing token
    /// where there is one, else the same holder granted at about the same
    /// time ([`SAME_GRANT`]).
    fn same_term(&self, other: &Leader) -> bool {
        match (self.term, other.term) {
            (Some(mine), Some(theirs)) => mine == theirs,
            _ => {
                let apart = match (self.since, other.since) {
                    (Some(mine), Some(theirs)) => Some(
                        mine.duration_since(theirs)
                            .or_else(|_| theirs.duration_since(mine))
                            .unwrap_or_default(),
                    ),
                    _ => None,
                };
                self.holder == other.holder && apart.is_none_or(|apart| apart < SAME_GRANT)
            }
        }
    }
}

/// Without fencing tokens, grant times this close are one grant: Redlock
/// answers an inspection from whichever nodes reply, and each node dates
/// the grant by its own clock, a few milliseconds apart.
const SAME_GRANT: Duration = Duration::from_secs(1);

/// Watches an election without campaigning: [`leader`](Self::leader) says
/// who leads now, [`changed`](Self::changed) waits for the next change.
///
/// Changes are read from the election's lock with [`Locker::inspect`], so
/// the backend must support inspection ([`crate::Capabilities::inspect`]:
/// every backend does, the file backend on Linux). The observer asks every
/// [`poll_interval`](Self::poll_interval) and, on backends with release
/// notifications, at once when the leader resigns. It reports every term it
/// sees, in order, once each; a term that begins and ends between two looks
/// is not seen. On a backend without fencing tokens (Redlock) a term is
/// told from the next by its holder and grant time, so the same process
/// elected again within a second is taken for the same term.
///
/// ```
/// use std::time::Duration;
/// use distlock::elect::Election;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::Error> {
/// let locker = distlock::connect("memory://").await?;
/// let election = Election::new(locker, "scheduler").proclaim("10.0.0.7:8080");
/// let mut observer = election.observe();
/// assert_eq!(observer.changed().await?, None, "nobody leads yet");
///
/// let term = election.campaign(None).await?;
/// let leader = observer.changed().await?.expect("a leader");
/// assert_eq!(leader.proclaimed.as_deref(), Some("10.0.0.7:8080"));
/// assert_eq!(leader.term, term.fencing_token());
/// term.resign().await?;
/// assert_eq!(observer.changed().await?, None);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Observer {
    locker: Arc<dyn Locker>,
    election: String,
    poll: Duration,
    /// What [`changed`](Self::changed) last reported; `None` before the
    /// first report.
    reported: Option<Option<Leader>>,
    /// The release notifications of the election's lock, once subscribed
    /// (`None`: not yet, or the backend has none, or the stream ended).
    /// Only ever reached through `&mut self` ([`Mutex::get_mut`], no
    /// locking): the mutex is there to make the observer `Sync`, so that
    /// [`leader`](Self::leader)'s future is `Send`.
    releases: Option<Mutex<ReleaseWatch>>,
    /// Whether the backend answered a subscription with "no
    /// notifications": then it is not asked again.
    no_notifications: bool,
    /// How soon the next look comes while a change is likely (after a
    /// release, or while nobody leads); `None` at the poll interval.
    quick: Option<Duration>,
}

impl Observer {
    /// An observer of the election `election` on `locker` (see also
    /// [`Election::observe`](super::Election::observe)).
    pub fn new(locker: Arc<dyn Locker>, election: impl Into<String>) -> Self {
        Observer {
            locker,
            election: election.into(),
            poll: DEFAULT_POLL_INTERVAL,
            reported: None,
            releases: None,
            no_notifications: false,
            quick: None,
        }
    }

    /// How often to ask who leads (default [`DEFAULT_POLL_INTERVAL`]); each
    /// look is one inspection of the election's lock.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll = interval.max(QUICK_LOOK);
        self
    }

    /// Who leads the election now, or `None` if nobody does.
    ///
    /// # Errors
    ///
    /// [`crate::Error::Unsupported`] on a backend that cannot inspect its
    /// locks (the file backend off Linux); a backend error if it failed or
    /// did not answer.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        Ok(self
            .locker
            .inspect(&self.election)
            .await?
            .map(Leader::from_held))
    }

    /// The leader as of the next change: at once on the first call (the
    /// current leader, or `None`), then when another term begins or the
    /// election is left without a leader.
    ///
    /// # Errors
    ///
    /// As [`leader`](Self::leader); the observer can be asked again after an
    /// error, and reports what changed since its last report.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a dropped call reports nothing, and the next call
    /// reports the change it would have.
    pub async fn changed(&mut self) -> Result<Option<Leader>> {
        let mut unknown_looks = 0;
        loop {
            let now = self.leader().await?;
            // A grant's record can trail its lock by a moment (Postgres:
            // the lock shows in `pg_locks` before the statement recording
            // its holder and token commits): look again before reporting a
            // leader nothing is known of. One that stays unknown (recording
            // off, no fencing, or a holder that is not distlock) is reported.
            let known = now
                .as_ref()
                .is_none_or(|leader| leader.term.is_some() || leader.holder.is_some());
            if !known && unknown_looks < UNKNOWN_LOOKS {
                unknown_looks += 1;
                tokio::time::sleep(QUICK_LOOK * unknown_looks).await;
                continue;
            }
            let is_new = match &self.reported {
                None => true,
                Some(None) => now.is_some(),
                Some(Some(before)) => now.as_ref().is_none_or(|now| !before.same_term(now)),
            };
            // Nobody leads: a candidate is probably about to be elected.
            self.quick = match now {
                None => Some(self.quick.map_or(QUICK_LOOK, |quick| quick * 2)),
                Some(_) => None,
            }
            .filter(|quick| *quick < self.poll);
            if is_new {
                counter!("distlock_election_leader_changes_total", "election" => self.election.clone())
                    .increment(1);
                self.reported = Some(now.clone());
                return Ok(now);
            }
            self.wait().await;
        }
    }

    /// The changes as a stream: each item is what
    /// [`changed`](Self::changed) returns, for ever (errors included; the
    /// stream goes on after one).
    pub fn into_changes(self) -> impl Stream<Item = Result<Option<Leader>>> + Send {
        futures_util::stream::unfold(self, |mut observer| async move {
            let change = observer.changed().await;
            Some((change, observer))
        })
    }

    /// Waits until the next look is due: the poll interval (or the quick
    /// look) passed, or the leader released the lock.
    async fn wait(&mut self) {
        if self.releases.is_none() && !self.no_notifications {
            match self.locker.watch_releases(&self.election).await {
                Ok(Some(watch)) => self.releases = Some(Mutex::new(watch)),
                Ok(None) => self.no_notifications = true,
                // Polling still works; the next wait subscribes again.
                Err(error) => tracing::debug!(
                    component = "distlock",
                    election = self.election.as_str(),
                    %error,
                    "cannot subscribe to release notifications; polling"
                ),
            }
        }
        let due = Instant::now() + self.quick.unwrap_or(self.poll);
        let releases = self
            .releases
            .as_mut()
            .map(|releases| releases.get_mut().unwrap_or_else(PoisonError::into_inner));
        match releases {
            Some(releases) => tokio::select! {
                _ = tokio::time::sleep_until(due) => {}
                open = releases.next() => {
                    if open {
                        self.quick = Some(QUICK_LOOK);
                    } else {
                        self.releases = None;
                    }
                }
            },
            None => tokio::time::sleep_until(due).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elect::Election;
    use crate::memory::MemoryLocker;
    use crate::LockerExt;

    #[tokio::test]
    async fn each_term_is_reported_once_in_order() {
        let locker = MemoryLocker::new().shared();
        let election = Election::new(locker.clone(), "jobs");
        let mut observer = election.observe().poll_interval(Duration::from_millis(20));
        assert_eq!(observer.changed().await.expect("look"), None);
        let mut terms = Vec::new();
        for candidate in ["a", "b", "c"] {
            let term = election
                .clone()
                .proclaim(candidate)
                .campaign(None)
                .await
                .expect("elected");
            let seen = observer.changed().await.expect("look").expect("leader");
            assert_eq!(seen.proclaimed.as_deref(), Some(candidate));
            assert_eq!(seen.term, term.fencing_token());
            terms.push(seen.term);
            term.resign().await.expect("resign");
            assert_eq!(observer.changed().await.expect("look"), None);
        }
        assert!(terms.windows(2).all(|pair| pair[0] < pair[1]), "{terms:?}");
    }

    #[tokio::test]
    async fn the_changes_stream_yields_what_changed_returns() {
        use futures_util::StreamExt;
        let election = Election::new(MemoryLocker::new().shared(), "jobs");
        let mut changes = Box::pin(election.observe().into_changes());
        assert_eq!(changes.next().await.expect("item").expect("look"), None);
        let term = election.campaign(None).await.expect("elected");
        let leader = changes.next().await.expect("item").expect("look");
        assert_eq!(leader.expect("a leader").term, term.fencing_token());
        term.resign().await.expect("resign");
    }

    #[tokio::test]
    async fn a_release_wakes_the_observer_before_its_poll_interval() {
        let locker = MemoryLocker::new().shared();
        let election = Election::new(locker, "jobs");
        let mut observer = election.observe().poll_interval(Duration::from_secs(30));
        let term = election.campaign(None).await.expect("elected");
        assert!(observer.changed().await.expect("look").is_some());
        let resigned = Instant::now();
        term.resign().await.expect("resign");
        let seen = tokio::time::timeout(Duration::from_secs(5), observer.changed())
            .await
            .expect("woken by the release, not the 30 s poll")
            .expect("look");
        assert_eq!(seen, None);
        assert!(resigned.elapsed() < Duration::from_secs(1));
    }
}
