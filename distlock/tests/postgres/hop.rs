//! A holder that reaches Postgres through a local hop, as users deploy it
//! (a Cloud SQL or AlloyDB auth proxy, an Envoy/Istio/Linkerd sidecar,
//! PgBouncer on the client host, an SSH tunnel, `kubectl port-forward`):
//! the hop's kernel answers the holder's TCP keepalive, so a server cut off
//! behind it is never noticed by the holder's socket. The holder must learn
//! from answers that do not come (its pings), before the server can free its
//! lock; and a server that never hears of the holder's death (the hop keeps
//! its side open) must still free the lock within the documented bound.

use std::time::Duration;

use distlock::postgres::PostgresLocker;
use distlock::{drift_margin, Locker};
use test_servers::{netns, FaultProxy, PostgresServer};
use tokio::time::Instant;

use crate::support::{holder_port, still_held_by, told_of_a_silent_session};

const TTL: Duration = Duration::from_secs(3);

/// A holder on a server reached through a local hop, holding `key`, two
/// seconds into the hold (the watch's pings are steady by then).
struct HeldThroughHop {
    server: PostgresServer,
    hop: FaultProxy,
    /// The locker; its sessions go through the hop.
    _holder: PostgresLocker,
    lease: distlock::Lease,
    /// The advisory key and the server pid of the session holding it.
    id: i64,
    pid: i32,
}

async fn hold_through_hop(key: &str) -> HeldThroughHop {
    let server = PostgresServer::start();
    let hop = FaultProxy::start(server.port());
    let holder = PostgresLocker::from_url(&hop.proxied_url(&server.url()))
        .await
        .unwrap();
    let id = holder.advisory_key(key);
    let lease = holder.try_lock(key, TTL).await.unwrap().expect("free");
    let (pid, _) = holder_port(&server, id);
    tokio::time::sleep(Duration::from_secs(2)).await;
    HeldThroughHop {
        server,
        hop,
        _holder: holder,
        lease,
        id,
        pid,
    }
}

/// Asserts the server still holds the lock, as `distlock run` relies on up
/// to `valid_until`: a "freed" answer fails only if the query finished
/// before `valid_until` (on a loaded machine the query itself may run past
/// it, and then says nothing about the promise).
fn assert_held_before(server: &PostgresServer, key: i64, pid: i32, valid_until: Instant) {
    let held = still_held_by(server, key, pid);
    let answered = Instant::now();
    assert!(
        held || answered >= valid_until,
        "the server freed the lock {:?} before the lease's validity ended",
        valid_until.saturating_duration_since(answered)
    );
}

/// Waits (up to `limit` after `from`) until the server no longer lists the
/// lock; returns when.
async fn freed(
    server: &PostgresServer,
    key: i64,
    pid: i32,
    from: Instant,
    limit: Duration,
) -> Instant {
    loop {
        if !still_held_by(server, key, pid) {
            return Instant::now();
        }
        assert!(
            from.elapsed() < limit,
            "the server still holds the lock {limit:?} after the cut"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn a_holder_behind_a_hop_whose_upstream_is_cut_stops_before_the_server_frees_its_lock() {
    // The test's path in this binary, as `--exact` matches it.
    const NAME: &str =
        "hop::a_holder_behind_a_hop_whose_upstream_is_cut_stops_before_the_server_frees_its_lock";
    if !netns::inside(NAME) {
        return netns::rerun_inside(NAME);
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(upstream_cut());
}

async fn upstream_cut() {
    let server = PostgresServer::start();
    let hop = FaultProxy::start(server.port());
    let holder = PostgresLocker::from_url(&hop.proxied_url(&server.url()))
        .await
        .unwrap();
    let contender = PostgresLocker::from_url(&server.url()).await.unwrap();
    let key = "behind-a-hop";
    let id = holder.advisory_key(key);
    let lease = holder.try_lock(key, TTL).await.unwrap().expect("free");
    let (pid, hop_upstream_port) = holder_port(&server, id);
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The hop stays up (it still answers the holder); its upstream goes silent.
    let cut = Instant::now();
    netns::cut_port(hop_upstream_port);
    let (detected, valid_until) = told_of_a_silent_session(&lease).await;
    assert!(
        detected - cut <= Duration::from_secs(6),
        "told {:?} after the cut; ping_interval + ping_timeout is 4 s",
        detected - cut
    );
    let grace = valid_until.saturating_duration_since(detected);
    assert!(
        grace >= Duration::from_secs(3),
        "the lease stays valid {grace:?} after its lost signal"
    );
    assert!(
        still_held_by(&server, id, pid),
        "the server still holds it when the holder learns"
    );
    // `distlock run` stops its command by valid_until − drift_margin(ttl).
    tokio::time::sleep_until(valid_until - drift_margin(TTL)).await;
    assert_held_before(&server, id, pid, valid_until);
    let freed_at = freed(&server, id, pid, cut, Duration::from_secs(30)).await;
    eprintln!(
        "cut → holder told {:?} → valid until {:?} → server frees {:?}",
        detected - cut,
        valid_until - cut,
        freed_at - cut
    );
    let next = contender.try_lock(key, TTL).await.unwrap();
    assert!(next.is_some(), "granted once the server freed it");
}

/// A hop that stops forwarding but keeps both of its connections open (its
/// kernel answers both sides' keepalives): neither end's TCP can notice.
/// The holder learns from its pings; the server frees the lock through the
/// `idle_session_timeout` distlock sets on its sessions, not hours later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hop_that_goes_silent_both_ways_frees_the_lock_within_the_documented_bound() {
    let HeldThroughHop {
        server,
        hop,
        lease,
        id,
        pid,
        ..
    } = hold_through_hop("silent-hop").await;
    let cut = Instant::now();
    hop.blackhole();
    let (detected, valid_until) = told_of_a_silent_session(&lease).await;
    assert!(
        detected - cut <= Duration::from_secs(6),
        "told {:?} after the hop went silent",
        detected - cut
    );
    tokio::time::sleep_until(valid_until - drift_margin(TTL)).await;
    assert_held_before(&server, id, pid, valid_until);
    // idle_session_timeout (10 s) from the session's last statement, and
    // the server's check of it: well within 20 s.
    let freed_at = freed(&server, id, pid, cut, Duration::from_secs(20)).await;
    assert!(
        freed_at >= valid_until,
        "freed {:?} after the cut, before the lease's validity ended ({:?})",
        freed_at - cut,
        valid_until - cut
    );
    eprintln!(
        "hop silent → holder told {:?} → valid until {:?} → server frees {:?}",
        detected - cut,
        valid_until - cut,
        freed_at - cut
    );
    hop.restore();
}

/// A server that falls silent long enough for the holder to give its
/// session up, and then answers again (a slow path, a stalled server): the
/// holder is told, and the server must still hold the lock until the
/// lease's validity ends. Closing the connection at the lost signal would
/// have freed it the moment the path came back, seconds before that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_given_up_for_silence_keeps_its_locks_on_the_server_through_the_grace() {
    let HeldThroughHop {
        server,
        hop,
        lease,
        id,
        pid,
        ..
    } = hold_through_hop("comes-back").await;
    let cut = Instant::now();
    hop.blackhole();
    let (_, valid_until) = told_of_a_silent_session(&lease).await;
    // The path comes back while the holder is inside its grace.
    hop.restore();
    let restored = Instant::now();
    assert!(
        valid_until > restored + Duration::from_secs(2),
        "the grace left at the restore: {:?}",
        valid_until.saturating_duration_since(restored)
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        still_held_by(&server, id, pid),
        "the server freed the lock 0.5 s after the path came back, {:?} before the lease's \
         validity ended",
        valid_until.saturating_duration_since(Instant::now())
    );
    tokio::time::sleep_until(valid_until - drift_margin(TTL)).await;
    assert_held_before(&server, id, pid, valid_until);
    let freed_at = freed(&server, id, pid, cut, Duration::from_secs(20)).await;
    eprintln!(
        "silent → restored {:?} → valid until {:?} → server frees {:?}",
        restored - cut,
        valid_until - cut,
        freed_at - cut
    );
}

/// A holder whose own process stalls (here: its runtime's only thread
/// blocked for longer than ping_interval + ping_timeout) must not take its
/// stall for the server's silence: the server answered the whole time.
#[test]
fn a_stalled_holder_does_not_give_up_a_session_its_server_kept_answering() {
    let server = PostgresServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let holder = PostgresLocker::from_url(&server.url()).await.unwrap();
        let lease = holder
            .try_lock("stalled", TTL)
            .await
            .unwrap()
            .expect("free");
        let lost = lease.lost_signal();
        // Let the watch send a ping and wait for its answer, then stall the
        // runtime while it waits (the answer arrives, unread).
        tokio::time::sleep(Duration::from_millis(1100)).await;
        std::thread::sleep(Duration::from_secs(6));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            !lost.is_lost(),
            "a 6 s stall of the holder's own runtime was taken for a silent server: {:?}",
            lost.reason()
        );
        let id = holder.advisory_key("stalled");
        assert_eq!(
            crate::support::holders(&server, id).len(),
            1,
            "still held on the server"
        );
        lease.release().await.unwrap();
    });
}
