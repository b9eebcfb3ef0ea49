//! A locker's sessions (`sessions=N`): its keys spread over them, each
//! key's node owned by its key's session, a batch checked per session, and
//! a locker of one key on one connection.

use distlock::{Locker, LostReason};
use test_servers::ZooKeeperServer;

use crate::refresh::{counted, hold, locker_with, requests};

/// The server's open client connections (`mntr` counts its own).
fn connections(server: &ZooKeeperServer) -> u64 {
    let alive = server.mntr("zk_num_alive_connections");
    alive.expect("zk_num_alive_connections in mntr") - 1
}

/// A locker of four sessions spreads its keys over them, each key's node
/// owned by its key's session, and checks a batch with one multi read per
/// session the leases live on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locker_of_four_sessions_spreads_its_keys_and_checks_each_sessions_leases_at_once() {
    let server = ZooKeeperServer::start();
    let locker = locker_with(&server, 4).await;
    let leases = hold(&locker, "spread-", 64).await;
    let mut sessions = std::collections::BTreeSet::new();
    for lease in &leases {
        let session = locker.session_id(lease.key()).await.expect("open");
        let held = locker.inspect(lease.key()).await.unwrap().expect("held");
        assert_eq!(
            held.session.as_deref(),
            Some(format!("session {session:#x}").as_str()),
            "{}'s node is owned by its key's session",
            lease.key()
        );
        sessions.insert(session);
    }
    assert_eq!(sessions.len(), 4, "64 keys over 4 sessions: {sessions:?}");
    let (results, sent) = counted(&server, &locker, &requests(&leases), 4).await;
    assert_eq!(sent, 4, "one multi read per session");
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    locker.close().await;
    for lease in &leases {
        assert_eq!(
            lease.lost_signal().reason(),
            Some(LostReason::ConnectionLost),
            "closing the locker closes every session"
        );
    }
}

/// A locker of four sessions used for one key opens one session: the one
/// it opened to check the ensemble is the key's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locker_of_one_key_has_one_session() {
    let server = ZooKeeperServer::start();
    let locker = locker_with(&server, 4).await;
    assert_eq!(
        connections(&server),
        1,
        "the session that checked the ensemble"
    );
    let lease = locker
        .try_lock("only", std::time::Duration::from_secs(30))
        .await
        .unwrap()
        .expect("free");
    assert!(locker.session_id("only").await.is_some());
    assert_eq!(connections(&server), 1, "the key took that session");
    lease.release().await.unwrap();
    locker.close().await;
}
