//! Release notifications for waiters: one subscriber connection per locker,
//! shared by all of its waiters.
//!
//! The release script publishes on the key's channel. A waiter subscribes
//! *before* its first attempt ([`crate::Locker::watch_releases`]), so a release
//! between a failed attempt and the wait cannot be missed. Rather than a
//! connection per waiter, a [`ReleaseHub`] keeps one `SUBSCRIBE`-mode
//! connection (a [`redis::aio::PubSub`], split so subscribing and reading
//! happen concurrently) and fans messages out to the waiters of each channel:
//!
//! - the first waiter of a channel subscribes and waits for the server's
//!   confirmation before its stream is handed out; later waiters of the same
//!   channel share that subscription;
//! - when the last waiter of a channel leaves, the session task unsubscribes;
//! - when the connection dies (server restart, network), every waiter's stream
//!   ends, so the waiting loop falls back to polling; the next waiter opens a
//!   new connection;
//! - a connection that goes silent without breaking (a half-open connection,
//!   a partition, a failover behind a proxy) is found by a `PING` every
//!   response timeout (at most every 10 s) while any channel has waiters: no answer within the
//!   response timeout closes it as if it had died, so it is detected within
//!   about twice the response timeout instead of never;
//! - connecting happens outside the hub's lock, each attempt bounded by the
//!   connect timeout: a waiter waits for its own attempt, never for another
//!   waiter's. While no connection is live, concurrent waiters each try one;
//!   the first to succeed is installed and shared, the others use it and
//!   close their own.
//!
//! Subscribe and unsubscribe are serialised per connection (`control`), which
//! keeps the channel table and the server's subscriptions in step: an entry
//! exists exactly while the server has confirmed the subscription.
//!
//! Where the subscriber connects depends on the deployment
//! ([`SubscriberSource`]):
//!
//! - **one server**: `SUBSCRIBE` on a RESP2 connection to it;
//! - **Sentinel**: the same, on the master the sentinels name when the
//!   connection is opened. A failover closes it (Sentinel's `CLIENT KILL`
//!   of the reconfigured servers' clients, or the old master's death), so
//!   waiters poll and the next waiter connects to the new master;
//! - **Cluster**: sharded pub/sub (`SSUBSCRIBE`, Redis 7+) through a RESP3
//!   redis-rs cluster connection, which sends each subscription to the node
//!   serving the channel's slot (the lock's slot: the channel shares its hash
//!   tag), and resubscribes after reconnects and slot-map changes. When a slot
//!   migrates, its old node drops the subscription with an `SUNSUBSCRIBE` push;
//!   the session subscribes again, which redis-rs sends to the slot's new
//!   node. The `PING` heartbeat goes to every node, so a dead node closes the
//!   session: waiters then poll until the next waiter opens a new one. A
//!   cluster without sharded pub/sub (Redis 6) refuses `SSUBSCRIBE`: its
//!   waiters poll.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use redis::aio::PubSubSink;
use redis::cluster_async::ClusterConnection;
use redis::{PushKind, RedisError, RedisResult, Value};
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::AbortHandle;

use super::connection::{ClusterSettings, SentinelConnection};
use crate::util;
use crate::ReleaseWatch;

/// Where a [`ReleaseHub`] opens its subscriber connection (see the module
/// docs).
pub(crate) enum SubscriberSource {
    /// `SUBSCRIBE` on this server (a RESP2 client).
    Node(redis::Client),
    /// `SUBSCRIBE` on the master the sentinels name at connection time.
    Sentinel(SentinelConnection),
    /// `SSUBSCRIBE` through a RESP3 cluster connection of its own.
    Cluster(ClusterSettings),
}

/// How a session subscribes, unsubscribes and pings.
enum Sink {
    PubSub(PubSubSink),
    Cluster(ClusterConnection),
}

impl Sink {
    async fn subscribe(&self, channel: &str) -> RedisResult<()> {
        match self {
            Sink::PubSub(sink) => sink.clone().subscribe(channel).await,
            Sink::Cluster(cluster) => cluster.clone().ssubscribe(channel).await,
        }
    }

    async fn unsubscribe(&self, channel: &str) -> RedisResult<()> {
        match self {
            Sink::PubSub(sink) => sink.clone().unsubscribe(channel).await,
            Sink::Cluster(cluster) => cluster.clone().sunsubscribe(channel).await,
        }
    }

    async fn ping(&self) -> RedisResult<()> {
        match self {
            Sink::PubSub(sink) => sink.clone().ping::<Value>().await.map(drop),
            // redis-rs sends PING to every node of the cluster.
            Sink::Cluster(cluster) => redis::cmd("PING")
                .query_async::<Value>(&mut cluster.clone())
                .await
                .map(drop),
        }
    }
}

/// What the server tells a session.
enum Event {
    /// A message on this channel: a release.
    Message(String),
    /// The server dropped this (sharded) subscription: its slot moved.
    Dropped(String),
}

/// The longest pause between PINGs of a subscriber connection with waiters
/// (the pause is the response timeout, capped here: tokio's interval cannot
/// take an unbounded period).
const MAX_PING_INTERVAL: Duration = Duration::from_secs(10);

/// Lazily connects, and reconnects after a failure, the one subscriber
/// connection of a locker.
pub(crate) struct ReleaseHub {
    source: SubscriberSource,
    connect_timeout: Duration,
    response_timeout: Duration,
    /// Held only to read or install the live session, never across an await.
    current: Mutex<Option<Live>>,
}

struct Live {
    session: Arc<Session>,
    task: AbortHandle,
}

impl ReleaseHub {
    /// A hub that connects to `source` when the first waiter arrives.
    pub(crate) fn new(
        source: SubscriberSource,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Self {
        ReleaseHub {
            source,
            connect_timeout,
            response_timeout,
            current: Mutex::new(None),
        }
    }

    /// A stream that yields whenever `channel` receives a message, ready (the
    /// subscription confirmed by the server) when this returns.
    pub(crate) async fn watch(&self, channel: String) -> RedisResult<ReleaseWatch> {
        let session = self.session().await?;
        session.join(channel, self.response_timeout).await
    }

    /// The live session, connecting a new one if there is none or the last
    /// one died. Waits at most the connect timeout.
    async fn session(&self) -> RedisResult<Arc<Session>> {
        if let Some(session) = self.live() {
            return Ok(session);
        }
        // Outside the lock: a hanging connect (a blackholed server) must not
        // hold up waiters that could use a connection someone else opens, nor
        // make them wait for more than their own bound.
        let (sink, messages) = tokio::time::timeout(self.connect_timeout, self.connect())
            .await
            .map_err(|_| timed_out("connecting the subscriber connection"))??;
        let mut current = util::lock(&self.current);
        if let Some(live) = current.as_ref().filter(|live| !live.session.is_closed()) {
            // Another waiter connected first: use its connection, drop ours.
            return Ok(live.session.clone());
        }
        let (idle_sender, idle_channels) = mpsc::unbounded_channel();
        let session = Arc::new(Session {
            sink,
            control: tokio::sync::Mutex::new(()),
            channels: Mutex::new(Channels::default()),
            idle_channels: idle_sender,
            shutdown: Notify::new(),
        });
        let task = tokio::spawn(run_session(
            session.clone(),
            messages,
            idle_channels,
            self.response_timeout,
        ))
        .abort_handle();
        tracing::debug!(
            component = "distlock",
            backend = super::BACKEND,
            "subscriber connection opened"
        );
        if let Some(dead) = current.replace(Live {
            session: session.clone(),
            task,
        }) {
            dead.task.abort();
        }
        Ok(session)
    }

    /// Opens a subscriber connection: how it subscribes, and what it hears.
    async fn connect(&self) -> RedisResult<(Sink, BoxStream<'static, Event>)> {
        let pubsub = match &self.source {
            SubscriberSource::Node(client) => client.get_async_pubsub().await?,
            SubscriberSource::Sentinel(sentinel) => {
                sentinel
                    .subscriber_client()
                    .await?
                    .get_async_pubsub()
                    .await?
            }
            SubscriberSource::Cluster(settings) => {
                let (pushes, received) = mpsc::unbounded_channel();
                let connection = settings
                    .client(Some(pushes))?
                    .get_async_connection()
                    .await?;
                let events = futures_util::stream::unfold(received, |mut received| async move {
                    received.recv().await.map(|push| (push, received))
                })
                .filter_map(|push| async move {
                    let channel = match push.data.first() {
                        Some(Value::BulkString(bytes)) => String::from_utf8(bytes.clone()).ok()?,
                        _ => return None,
                    };
                    match push.kind {
                        PushKind::SMessage => Some(Event::Message(channel)),
                        PushKind::SUnsubscribe => Some(Event::Dropped(channel)),
                        _ => None,
                    }
                });
                return Ok((Sink::Cluster(connection), events.boxed()));
            }
        };
        let (sink, messages) = pubsub.split();
        let events = messages.map(|message| Event::Message(message.get_channel_name().to_owned()));
        Ok((Sink::PubSub(sink), events.boxed()))
    }

    fn live(&self) -> Option<Arc<Session>> {
        util::lock(&self.current)
            .as_ref()
            .filter(|live| !live.session.is_closed())
            .map(|live| live.session.clone())
    }
}

impl Drop for ReleaseHub {
    fn drop(&mut self) {
        if let Some(live) = self
            .current
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            live.task.abort();
        }
    }
}

/// One subscriber connection and the waiters it serves.
struct Session {
    sink: Sink,
    /// Held across each `SUBSCRIBE`/`UNSUBSCRIBE` and its confirmation.
    control: tokio::sync::Mutex<()>,
    channels: Mutex<Channels>,
    /// Channels whose last waiter left, for the session task to unsubscribe.
    idle_channels: mpsc::UnboundedSender<String>,
    /// Tells the session task to stop (the connection is unusable).
    shutdown: Notify,
}

#[derive(Default)]
struct Channels {
    /// Set once the connection is gone; no channel is added after that.
    closed: bool,
    by_name: HashMap<String, Channel>,
}

struct Channel {
    waiters: usize,
    /// Bumped on every message; dropping it ends the waiters' streams.
    wake: watch::Sender<()>,
}

impl Session {
    fn channels(&self) -> MutexGuard<'_, Channels> {
        util::lock(&self.channels)
    }

    fn is_closed(&self) -> bool {
        self.channels().closed
    }

    /// True while some waiter listens: only then is liveness worth a PING.
    fn has_waiters(&self) -> bool {
        !self.channels().by_name.is_empty()
    }

    /// PINGs the server: an error if no answer comes within `response_timeout`
    /// (RESP2 allows `PING` in subscribe mode; the answer is `["pong", ""]`).
    async fn ping(&self, response_timeout: Duration) -> RedisResult<()> {
        let answered = tokio::time::timeout(response_timeout, self.sink.ping()).await;
        answered.map_err(|_| timed_out("PING on the subscriber connection"))??;
        Ok(())
    }

    async fn join(
        self: Arc<Self>,
        channel: String,
        response_timeout: Duration,
    ) -> RedisResult<ReleaseWatch> {
        let _control = self.control.lock().await;
        let wake = match self.add_waiter(&channel)? {
            Some(wake) => wake,
            None => {
                let confirmed =
                    tokio::time::timeout(response_timeout, self.sink.subscribe(&channel)).await;
                if let Err(err) = confirmed_in_time(confirmed, "subscribing") {
                    // An unanswered or failed SUBSCRIBE leaves the connection in
                    // an unknown state: start afresh with the next waiter.
                    self.close();
                    return Err(err);
                }
                self.add_channel(&channel)?
            }
        };
        let waiter = Waiter {
            session: self.clone(),
            channel,
        };
        Ok(ReleaseWatch::from_stream(futures_util::stream::unfold(
            (wake, waiter),
            |(mut wake, waiter)| async move {
                wake.changed().await.ok()?;
                Some(((), (wake, waiter)))
            },
        )))
    }

    /// Joins an existing subscription: `None` if `channel` has none yet.
    fn add_waiter(&self, channel: &str) -> RedisResult<Option<watch::Receiver<()>>> {
        let mut channels = self.channels();
        if channels.closed {
            return Err(closed());
        }
        Ok(channels.by_name.get_mut(channel).map(|entry| {
            entry.waiters += 1;
            entry.wake.subscribe()
        }))
    }

    /// Records a subscription the server just confirmed, with one waiter.
    fn add_channel(&self, channel: &str) -> RedisResult<watch::Receiver<()>> {
        let mut channels = self.channels();
        if channels.closed {
            return Err(closed());
        }
        let (wake, receiver) = watch::channel(());
        channels
            .by_name
            .insert(channel.to_owned(), Channel { waiters: 1, wake });
        Ok(receiver)
    }

    fn leave(&self, channel: &str) {
        let mut channels = self.channels();
        let Some(entry) = channels.by_name.get_mut(channel) else {
            return;
        };
        entry.waiters = entry.waiters.saturating_sub(1);
        if entry.waiters == 0 {
            // Fails only if the session task is gone, which clears the table.
            let _ = self.idle_channels.send(channel.to_owned());
        }
    }

    fn notify(&self, channel: &str) {
        if let Some(entry) = self.channels().by_name.get(channel) {
            entry.wake.send_replace(());
        }
    }

    /// Unsubscribes from `channel` unless a waiter joined it again meanwhile.
    async fn unsubscribe_if_idle(
        &self,
        channel: String,
        response_timeout: Duration,
    ) -> RedisResult<()> {
        let _control = self.control.lock().await;
        {
            let mut channels = self.channels();
            match channels.by_name.get(&channel) {
                Some(entry) if entry.waiters == 0 => channels.by_name.remove(&channel),
                _ => return Ok(()),
            };
        }
        confirmed_in_time(
            tokio::time::timeout(response_timeout, self.sink.unsubscribe(&channel)).await,
            "unsubscribing",
        )
    }

    /// Subscribes to `channel` again after the server dropped it (its slot
    /// moved to another node), if it still has waiters. A subscription that
    /// is still live (the push was the echo of our own unsubscribe, raced by
    /// a new waiter's subscribe) is confirmed again: `SSUBSCRIBE` is
    /// idempotent.
    async fn resubscribe(&self, channel: String, response_timeout: Duration) -> RedisResult<()> {
        let _control = self.control.lock().await;
        if !self.channels().by_name.contains_key(&channel) {
            return Ok(());
        }
        confirmed_in_time(
            tokio::time::timeout(response_timeout, self.sink.subscribe(&channel)).await,
            "subscribing again after a slot migration",
        )
    }

    /// Marks the session dead: every waiter's stream ends (dropping the
    /// senders), no waiter joins it any more, and its task stops.
    fn close(&self) {
        let mut channels = self.channels();
        channels.closed = true;
        channels.by_name.clear();
        drop(channels);
        self.shutdown.notify_one();
    }
}

/// A waiter's membership of a channel; leaving is dropping it.
struct Waiter {
    session: Arc<Session>,
    channel: String,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        self.session.leave(&self.channel);
    }
}

/// Closes the session however its task ends (returns, or is aborted).
struct CloseOnExit(Arc<Session>);

impl Drop for CloseOnExit {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Reads the connection's messages and wakes their channels' waiters,
/// unsubscribes channels whose waiters all left, and PINGs the server every
/// `response_timeout` while anyone waits, until the connection ends or stops
/// answering.
async fn run_session(
    session: Arc<Session>,
    mut messages: BoxStream<'static, Event>,
    mut idle_channels: mpsc::UnboundedReceiver<String>,
    response_timeout: Duration,
) {
    let _close = CloseOnExit(session.clone());
    // A closed connection ends `messages`; a silent one ends nothing, so the
    // heartbeat is what finds it (else waiters poll slowly forever).
    let period = response_timeout.min(MAX_PING_INTERVAL);
    let now = tokio::time::Instant::now();
    let mut heartbeat = tokio::time::interval_at(now.checked_add(period).unwrap_or(now), period);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            message = messages.next() => match message {
                Some(Event::Message(channel)) => session.notify(&channel),
                Some(Event::Dropped(channel)) => {
                    if let Err(error) = session.resubscribe(channel, response_timeout).await {
                        tracing::debug!(component = "distlock", backend = super::BACKEND, %error,
                            "subscribing again failed; dropping the subscriber connection");
                        return;
                    }
                }
                None => {
                    tracing::debug!(component = "distlock", backend = super::BACKEND,
                        "subscriber connection closed; waiters fall back to polling");
                    return;
                }
            },
            Some(channel) = idle_channels.recv() => {
                if let Err(error) = session.unsubscribe_if_idle(channel, response_timeout).await {
                    tracing::debug!(component = "distlock", backend = super::BACKEND, %error,
                        "unsubscribing failed; dropping the subscriber connection");
                    return;
                }
            }
            // Not a select guard: one is evaluated only when the select
            // starts, and this one waits long before the first waiter joins.
            _ = heartbeat.tick() => {
                if !session.has_waiters() {
                    continue;
                }
                if let Err(error) = session.ping(response_timeout).await {
                    tracing::debug!(component = "distlock", backend = super::BACKEND, %error,
                        "the subscriber connection stopped answering; waiters fall back to polling");
                    return;
                }
            }
            () = session.shutdown.notified() => return,
        }
    }
}

/// The server's confirmation of a (un)subscribe, or why there was none.
fn confirmed_in_time(
    result: Result<RedisResult<()>, tokio::time::error::Elapsed>,
    doing: &str,
) -> RedisResult<()> {
    result.map_err(|_| timed_out(doing))?
}

fn timed_out(doing: &str) -> RedisError {
    io::Error::new(io::ErrorKind::TimedOut, format!("{doing} timed out")).into()
}

fn closed() -> RedisError {
    io::Error::new(
        io::ErrorKind::NotConnected,
        "the subscriber connection closed",
    )
    .into()
}
