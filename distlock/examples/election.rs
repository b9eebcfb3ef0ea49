//! Leader election (`distlock::elect`): candidates campaign, one leads at a
//! time with a numbered term, observers watch who leads without
//! campaigning.
//!
//! ```sh
//! cargo run -p distlock --example election
//! ```
//!
//! Start it in two or three terminals: one leads for `LEAD_FOR` (default
//! 5 s) and resigns, the next is elected at once (its term one higher), and
//! every copy's observer prints each change. Ctrl-C a leader and another
//! takes over too: on the default file backend the kernel frees a dead
//! process's lock. With no `DISTLOCK_URL` the election is a lock file in the
//! default directory; `DISTLOCK_URL=etcd://127.0.0.1:2379 cargo run -p
//! distlock --example election --features etcd` runs it on etcd, where
//! `etcdctl elect -l lock:scheduler` sees the proclaimed value.

use std::time::Duration;

use distlock::elect::{Election, TermInfo};

mod common;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// On expiring backends a dead leader blocks the election this long; the
/// keepalive refreshes the term every ttl/3.
const TTL: Duration = Duration::from_secs(6);

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let lead_for = match std::env::var("LEAD_FOR") {
        Ok(text) => humantime::parse_duration(&text)
            .map_err(|error| format!("LEAD_FOR={text:?}: {error} (try 5s, 1m)"))?,
        Err(_) => Duration::from_secs(5),
    };
    let locker = common::locker_from_env().await?;
    let me = format!("candidate-{}", std::process::id());
    let election = Election::new(locker, "scheduler")
        .ttl(TTL)
        // What observers (and `distlock status --key scheduler`) read as
        // the leader's value: an address, an id.
        .proclaim(me.clone());

    // An observer beside the campaign: prints every change of leader.
    let mut observer = election.observe();
    let watch = tokio::spawn(async move {
        loop {
            match observer.changed().await {
                Ok(Some(leader)) => println!(
                    "observer: term {:?} led by {}",
                    leader.term,
                    leader.proclaimed.as_deref().unwrap_or("an unknown holder")
                ),
                Ok(None) => println!("observer: no leader"),
                Err(error) => {
                    eprintln!("observer: {error}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    });

    println!("{me} campaigning");
    // Waits as long as it takes (`None`), leads, then resigns: the work is
    // dropped first if the term ends early (`Error::Lost`), and the next
    // leader is elected only after it stopped.
    let led = election
        .lead(None, |term| lead(term, me.clone(), lead_for))
        .await;
    watch.abort();
    match led {
        Ok(done) => {
            done.release?;
            println!("{me} resigned");
            Ok(())
        }
        Err(error) => Err(error.into()),
    }
}

/// The leader's work: here, a heartbeat; in a service, the singleton duty
/// (with `term.fencing_token` passed to every write it makes).
async fn lead(term: TermInfo, me: String, lead_for: Duration) {
    println!(
        "{me} leads {} in term {:?}",
        term.election, term.fencing_token
    );
    let heartbeat = async {
        let mut beat = tokio::time::interval(Duration::from_secs(1));
        loop {
            beat.tick().await;
            println!("{me}: leading");
        }
    };
    // Leads for `lead_for` (a duration too long to represent: for ever).
    let _elapsed = tokio::time::timeout(lead_for, heartbeat).await;
}
