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
//!   new connection.
//!
//! Subscribe and unsubscribe are serialised per connection (`control`), which
//! keeps the channel table and the server's subscriptions in step: an entry
//! exists exactly while the server has confirmed the subscription.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use redis::{RedisError, RedisResult};
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::AbortHandle;

use crate::ReleaseWatch;

/// Lazily connects, and reconnects after a failure, the one subscriber
/// connection of a locker.
pub(crate) struct ReleaseHub {
    client: redis::Client,
    connect_timeout: Duration,
    response_timeout: Duration,
    current: tokio::sync::Mutex<Option<Live>>,
}

struct Live {
    session: Arc<Session>,
    task: AbortHandle,
}

impl ReleaseHub {
    /// A hub that connects with `client` when the first waiter arrives.
    pub(crate) fn new(
        client: redis::Client,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Self {
        ReleaseHub {
            client,
            connect_timeout,
            response_timeout,
            current: tokio::sync::Mutex::new(None),
        }
    }

    /// A stream that yields whenever `channel` receives a message, ready (the
    /// subscription confirmed by the server) when this returns.
    pub(crate) async fn watch(&self, channel: String) -> RedisResult<ReleaseWatch> {
        let session = self.session().await?;
        session.join(channel, self.response_timeout).await
    }

    /// The live session, connecting a new one if there is none or the last
    /// one died. Concurrent callers wait for the same connection attempt.
    async fn session(&self) -> RedisResult<Arc<Session>> {
        let mut current = self.current.lock().await;
        if let Some(live) = current.as_ref().filter(|live| !live.session.is_closed()) {
            return Ok(live.session.clone());
        }
        let pubsub = tokio::time::timeout(self.connect_timeout, self.client.get_async_pubsub())
            .await
            .map_err(|_| timed_out("connecting the subscriber connection"))??;
        let (sink, messages) = pubsub.split();
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
        *current = Some(Live {
            session: session.clone(),
            task,
        });
        Ok(session)
    }
}

impl Drop for ReleaseHub {
    fn drop(&mut self) {
        if let Some(live) = self.current.get_mut().take() {
            live.task.abort();
        }
    }
}

/// One subscriber connection and the waiters it serves.
struct Session {
    sink: PubSubSink,
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
        self.channels.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn is_closed(&self) -> bool {
        self.channels().closed
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
                let mut sink = self.sink.clone();
                let confirmed =
                    tokio::time::timeout(response_timeout, sink.subscribe(&channel)).await;
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
        let mut sink = self.sink.clone();
        confirmed_in_time(
            tokio::time::timeout(response_timeout, sink.unsubscribe(&channel)).await,
            "unsubscribing",
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

/// Reads the connection's messages and wakes their channels' waiters, and
/// unsubscribes channels whose waiters all left, until the connection ends.
async fn run_session(
    session: Arc<Session>,
    mut messages: PubSubStream,
    mut idle_channels: mpsc::UnboundedReceiver<String>,
    response_timeout: Duration,
) {
    let _close = CloseOnExit(session.clone());
    loop {
        tokio::select! {
            message = messages.next() => match message {
                Some(message) => session.notify(message.get_channel_name()),
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
