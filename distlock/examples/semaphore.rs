//! A counting semaphore (`distlock::semaphore`): at most N holders of a name
//! across every process and host that shares the backend, each permit a
//! lease of its own (fencing token, lost signal, keepalive).
//!
//! ```sh
//! cargo run -p distlock --example semaphore
//! ```
//!
//! Five workers share 2 permits of `partner-api`: two hold at a time, the
//! others wait and take a permit as one is released. Start it in a second
//! terminal meanwhile and the workers of both share the same 2 permits.
//! With no `DISTLOCK_URL` the permits are lock files in the default
//! directory; `DISTLOCK_URL=redis://127.0.0.1:6379 cargo run -p distlock
//! --example semaphore --features redis` shares them through Redis.

use std::sync::Arc;
use std::time::Duration;

use distlock::semaphore::Semaphore;

mod common;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const PERMITS: u32 = 2;
const WORKERS: u32 = 5;
const TTL: Duration = Duration::from_secs(10);
/// How long a worker waits for a permit before giving up.
const WAIT: Duration = Duration::from_secs(30);

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let locker = common::locker_from_env().await?;
    // Every holder must use the same limit for one name: an acquirer that
    // finds permit N held fails with `InvalidInput`.
    let semaphore = Arc::new(Semaphore::new(locker, "partner-api", PERMITS)?);

    let mut workers = tokio::task::JoinSet::new();
    for worker in 1..=WORKERS {
        let semaphore = semaphore.clone();
        workers.spawn(async move { call_partner(&semaphore, worker).await });
    }
    while let Some(joined) = workers.join_next().await {
        joined??;
    }
    Ok(())
}

/// One worker: waits for a permit, uses it, gives it back.
async fn call_partner(semaphore: &Semaphore, worker: u32) -> distlock::Result<()> {
    let permit = semaphore.acquire(TTL, WAIT).await?;
    // The permit is a lock on one of the N permit keys (`partner-api#0`,
    // `partner-api#1`); its fencing token increases per permit key.
    println!(
        "worker {worker}: holds {} (token {:?})",
        permit.key(),
        permit.fencing_token()
    );
    // Work shorter than the ttl; longer work would call `keep_alive` and
    // stop when `permit.lost_signal()` fires, as a lock holder does.
    permit
        .run_while_held(tokio::time::sleep(Duration::from_secs(1)))
        .await
        .map_err(|reason| distlock::Error::Lost {
            key: permit.key().to_owned(),
            reason,
        })?;
    println!("worker {worker}: releasing {}", permit.key());
    permit.release().await
}
