//! A nightly job that runs on one replica at a time, under `with_lock`, and
//! whose write is **fenced**: the table keeps the fencing token of the last
//! grant that wrote each row and refuses a write carrying a lower one. A
//! holder that lost its lock without knowing it (a long GC pause, a stopped
//! VM) then cannot overwrite the work of the holder after it, however late
//! its write arrives. RELIABILITY.md, "Fencing: why it matters and how to use
//! the token", explains the pattern; this is it, runnable.
//!
//! ```sh
//! # A private server on a free loopback port; it prints `postgres URL` and
//! # runs until Ctrl-D.
//! cargo run -p test-servers --example serve -- postgres
//! # In another terminal, with that URL:
//! DATABASE_URL='postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable' \
//!     cargo run -p distlock --example nightly_fenced --features postgres
//! ```
//!
//! Postgres is both the lock (session advisory locks, `distlock::postgres`)
//! and the resource here, which is the best case: tokens come from a counter
//! row committed with each grant, so they strictly increase across grants,
//! clients and restarts. The URL must be one tokio-postgres accepts as well
//! (no distlock-only parameters such as `fencing_table`), and this example
//! connects without TLS (`sslmode=disable` or `prefer`). Run it twice: the
//! second run's token is one higher, and the stale write it shows at the end
//! (the previous token) updates no row.

use std::time::Duration;

use distlock::{Completed, KeepAlive, LeaseInfo, WithLock};
use tokio_postgres::{Client, NoTls};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The lock every replica's nightly job contends for.
const KEY: &str = "nightly-report";
/// Postgres locks do not expire (the session holds them); the ttl matters
/// on expiring backends, and the keepalive refreshes it every ttl/3.
const TTL: Duration = Duration::from_secs(60);
/// Zero: one attempt. A replica that finds the job running skips tonight's
/// run instead of running it a second time after the first.
const WAIT: Duration = Duration::ZERO;
/// A hung job gives the lock up after this: its lost signal fires and
/// `WithLock` drops the job before releasing.
const MAX_HOLD: Duration = Duration::from_secs(3600);

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("DATABASE_URL").map_err(|_| {
        "set DATABASE_URL=postgres://... (`cargo run -p test-servers --example serve -- postgres` starts one)"
    })?;
    let locker = distlock::connect(&url).await?;
    let db = connect_resource(&url).await?;
    create_table(&db).await?;

    let job = WithLock::default().keep_alive(KeepAlive::default().max_hold(MAX_HOLD));
    let outcome = job
        .run(&*locker, KEY, TTL, WAIT, |lease| nightly_report(&db, lease))
        .await;
    let token = match outcome {
        Ok(Completed { value, release }) => {
            let token = value?;
            // The job's result stands whatever the release did; a failed
            // release is freed by the backend's safety net (here: the
            // session's end).
            if let Err(error) = release {
                eprintln!("release failed (the session's end frees the lock): {error}");
            }
            token
        }
        Err(error) if error.is_contention() => {
            println!("{KEY} is held by another replica: it runs tonight's report");
            return Ok(());
        }
        // `Error::Lost`: the job was stopped (dropped) before the lock was
        // let go; nothing after its last fenced write happened.
        Err(error) => return Err(error.into()),
    };

    // What the fence is for: the previous holder, waking up late and
    // writing with its own (lower) token, changes nothing.
    let stale = token.saturating_sub(1);
    let updated = fenced_write(&db, stale, "a stale holder's report").await?;
    println!("a late write with the previous token {stale}: {updated} rows updated (refused)");
    Ok(())
}

/// The job: computes the report and writes it through the fence. Returns
/// the token it wrote with.
async fn nightly_report(db: &Client, lease: LeaseInfo) -> Result<i64, BoxError> {
    let token = lease
        .fencing_token
        .ok_or("this locker hands out no fencing tokens (`fencing=off`): nothing to fence with")?;
    // Postgres `bigint` is signed and tokens are `u64`. A checked conversion,
    // never `token as i64`: past `i64::MAX` that wraps to a negative number,
    // which every row's fence would refuse for ever. Postgres tokens come
    // from a `bigint` counter and always fit; the check makes a token that
    // did not (a resource fenced by another backend's tokens) fail loudly.
    let token =
        i64::try_from(token).map_err(|_| format!("fencing token {token} does not fit a bigint"))?;
    println!("took {} with fencing token {token}", lease.key);

    let sessions: i64 = db
        .query_one("SELECT count(*) FROM pg_stat_activity", &[])
        .await?
        .get(0);
    let summary = format!("{sessions} sessions open");
    // The report's real work; long enough for a second copy started
    // meanwhile to find the lock held.
    tokio::time::sleep(Duration::from_secs(2)).await;

    match fenced_write(db, token, &summary).await? {
        0 => Err(format!(
            "a grant newer than token {token} has written the report: this job no longer holds the lock"
        )
        .into()),
        updated => {
            println!("wrote the report ({summary}): {updated} row updated with token {token}");
            Ok(token)
        }
    }
}

/// The fenced write: applied only if no grant with this token or a newer
/// one has written the row. `<` admits one write per grant and row (use
/// `<=` for several writes to one row under one grant, see RELIABILITY.md).
async fn fenced_write(
    db: &Client,
    token: i64,
    summary: &str,
) -> Result<u64, tokio_postgres::Error> {
    db.execute(
        "UPDATE nightly_report SET summary = $2, generated_at = now(), fencing_token = $1 \
         WHERE id = 1 AND fencing_token < $1",
        &[&token, &summary],
    )
    .await
}

/// The resource: an ordinary connection, separate from the locker's
/// sessions (which the locker keeps to itself for as long as it holds locks).
async fn connect_resource(url: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            eprintln!("resource connection ended: {error}");
        }
    });
    Ok(client)
}

/// The table with its fence: the highest token that wrote each row.
async fn create_table(db: &Client) -> Result<(), tokio_postgres::Error> {
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS nightly_report (
             id int PRIMARY KEY,
             summary text,
             generated_at timestamptz,
             fencing_token bigint NOT NULL DEFAULT 0
         );
         INSERT INTO nightly_report (id) VALUES (1) ON CONFLICT (id) DO NOTHING;",
    )
    .await
}
