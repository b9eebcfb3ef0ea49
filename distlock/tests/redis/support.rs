//! Helpers the Redis modules share.

use distlock::redis::RedisLocker;
use test_servers::RedisServer;

/// A locker on `server` with the default configuration.
/// The owner token held in the Redis key `redis_key` (`""` if it is
/// absent): the lock key's value up to its first line break, where the
/// holder record starts (see `src/redis/scripts.rs`).
pub fn stored_owner(server: &RedisServer, redis_key: &str) -> String {
    let value = server.cli(&["GET", redis_key]);
    value.split('\n').next().unwrap_or_default().to_owned()
}

pub async fn connect(server: &RedisServer) -> RedisLocker {
    RedisLocker::from_url(&server.url())
        .await
        .expect("connect to the test redis-server")
}

/// The messages of the `warn` events logged on this thread while the guard
/// lives (a `#[tokio::test]` runs on one thread, its spawned tasks too).
#[derive(Clone, Default)]
pub struct Warnings(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Warnings {
    /// Starts capturing; stops when the guard is dropped.
    pub fn capture() -> (Warnings, tracing::subscriber::DefaultGuard) {
        use tracing_subscriber::layer::SubscriberExt;
        let warnings = Warnings::default();
        let subscriber = tracing_subscriber::registry().with(warnings.clone());
        (warnings, tracing::subscriber::set_default(subscriber))
    }

    /// Every warning so far.
    pub fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    /// The warnings so far that contain `text`.
    pub fn containing(&self, text: &str) -> Vec<String> {
        self.all()
            .into_iter()
            .filter(|w| w.contains(text))
            .collect()
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message<'a>(&'a mut String);
        impl tracing::field::Visit for Message<'_> {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    *self.0 = format!("{value:?}");
                }
            }
        }
        if *event.metadata().level() == tracing::Level::WARN {
            let mut message = String::new();
            event.record(&mut Message(&mut message));
            self.0.lock().unwrap().push(message);
        }
    }
}
