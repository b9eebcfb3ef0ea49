//! The metrics and tracing wrappers emit what their docs promise, with the
//! promised labels and fields, and never a key label or an owner token.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::memory::MemoryLocker;
use distlock::{Error, KeepAlive, Locker, LockerExt, LostReason};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

const TTL: Duration = Duration::from_secs(30);

/// Runs `work` on a current-thread runtime: thread-scoped recorders and
/// subscribers then see every task it spawns.
fn block_on<F: std::future::Future>(work: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(work)
}

type Labels = Vec<(String, String)>;

fn counters(
    recorder: &DebuggingRecorder,
) -> (HashMap<(String, Labels), u64>, HashMap<String, usize>) {
    let mut counters = HashMap::new();
    let mut histograms = HashMap::new();
    for (key, _, _, value) in recorder.snapshotter().snapshot().into_vec() {
        let (kind, key) = key.into_parts();
        let mut labels: Labels = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        labels.sort();
        assert!(
            labels.iter().all(|(name, _)| name != "key"),
            "a key label on {}",
            key.name()
        );
        match (kind, value) {
            (MetricKind::Counter, DebugValue::Counter(n)) => {
                counters.insert((key.name().to_owned(), labels), n);
            }
            (MetricKind::Histogram, DebugValue::Histogram(values)) => {
                *histograms.entry(key.name().to_owned()).or_default() += values.len();
            }
            _ => {}
        }
    }
    (counters, histograms)
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    let mut labels: Labels = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    labels.sort();
    labels
}

#[test]
fn metrics_count_every_outcome_with_low_cardinality_labels() {
    let recorder = DebuggingRecorder::new();
    metrics::with_local_recorder(&recorder, || {
        block_on(async {
            let locker = MemoryLocker::new().with_metrics().shared();
            let lease = locker.try_lock("k", TTL).await.unwrap().unwrap();
            assert!(locker.try_lock("k", TTL).await.unwrap().is_none());
            assert!(matches!(
                locker.lock("k", TTL, Duration::from_millis(30)).await,
                Err(Error::Timeout { .. })
            ));
            let owner = lease.owner().to_owned();
            lease.release().await.unwrap();
            assert!(matches!(
                locker.unlock("k", &owner).await,
                Err(Error::NotHeld { .. })
            ));
            assert!(matches!(
                locker.try_lock("", TTL).await,
                Err(Error::InvalidInput { .. })
            ));

            // A kept-alive lease whose lock is released behind its back is lost.
            let mut lease = locker
                .try_lock("k", Duration::from_millis(90))
                .await
                .unwrap()
                .unwrap();
            lease.keep_alive(KeepAlive::default()).unwrap();
            locker.unlock("k", lease.owner()).await.unwrap();
            assert_eq!(lease.lost_signal().wait().await, LostReason::NotHeld);
        })
    });
    let (counters, histograms) = counters(&recorder);
    let count = |name: &str, pairs: &[(&str, &str)]| {
        counters
            .get(&(name.to_owned(), labels(pairs)))
            .copied()
            .unwrap_or(0)
    };
    let memory = ("backend", "memory");
    assert_eq!(
        count(
            "distlock_attempts_total",
            &[memory, ("operation", "try_lock")]
        ),
        4
    );
    assert_eq!(
        count("distlock_attempts_total", &[memory, ("operation", "lock")]),
        1
    );
    assert_eq!(
        count(
            "distlock_acquired_total",
            &[memory, ("operation", "try_lock")]
        ),
        2
    );
    assert_eq!(
        count(
            "distlock_contended_total",
            &[memory, ("operation", "try_lock")]
        ),
        1
    );
    assert_eq!(count("distlock_timeouts_total", &[memory]), 1);
    assert_eq!(
        count(
            "distlock_releases_total",
            &[memory, ("outcome", "released")]
        ),
        2
    );
    assert_eq!(
        count(
            "distlock_releases_total",
            &[memory, ("outcome", "not_held")]
        ),
        1
    );
    assert_eq!(
        count(
            "distlock_not_held_total",
            &[memory, ("operation", "unlock")]
        ),
        1
    );
    assert_eq!(
        count(
            "distlock_not_held_total",
            &[memory, ("operation", "refresh")]
        ),
        1
    );
    assert_eq!(
        count(
            "distlock_errors_total",
            &[
                memory,
                ("operation", "try_lock"),
                ("outcome", "invalid_input")
            ]
        ),
        1
    );
    assert_eq!(
        count("distlock_lost_total", &[memory, ("reason", "not_held")]),
        1
    );
    assert_eq!(histograms.get("distlock_hold_duration_seconds"), Some(&2));
    assert_eq!(histograms.get("distlock_wait_duration_seconds"), Some(&1));
    assert!(histograms["distlock_operation_duration_seconds"] >= 7);
}

/// One recorded span: its name and its fields as strings.
#[derive(Debug, Clone)]
struct SpanRecord {
    name: &'static str,
    fields: HashMap<String, String>,
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<(Id, SpanRecord)>>>);

struct FieldText<'a>(&'a mut HashMap<String, String>);

impl Visit for FieldText<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        );
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut fields = HashMap::new();
        attrs.record(&mut FieldText(&mut fields));
        let record = SpanRecord {
            name: attrs.metadata().name(),
            fields,
        };
        self.0.lock().unwrap().push((id.clone(), record));
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut spans = self.0.lock().unwrap();
        if let Some((_, record)) = spans.iter_mut().rev().find(|(span, _)| span == id) {
            values.record(&mut FieldText(&mut record.fields));
        }
    }
}

#[test]
fn spans_carry_backend_keys_and_outcomes_but_never_owner_tokens() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    let owner = tracing::subscriber::with_default(subscriber, || {
        block_on(async {
            let locker = MemoryLocker::new()
                .with_prefix("app:")
                .with_tracing()
                .shared();
            let lease = locker.try_lock("job", TTL).await.unwrap().unwrap();
            assert!(locker.try_lock("job", TTL).await.unwrap().is_none());
            let owner = lease.owner().to_owned();
            lease.release().await.unwrap();
            assert!(locker.unlock("job", &owner).await.is_err());
            owner
        })
    });
    let spans: Vec<SpanRecord> = capture
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|(_, r)| r.clone())
        .collect();
    let names: Vec<&str> = spans.iter().map(|s| s.name).collect();
    assert_eq!(
        names,
        [
            "distlock.try_lock",
            "distlock.try_lock",
            "distlock.unlock",
            "distlock.unlock"
        ]
    );
    let field = |i: usize, name: &str| spans[i].fields.get(name).cloned().unwrap_or_default();
    for i in 0..4 {
        assert_eq!(field(i, "component"), "distlock");
        assert_eq!(field(i, "backend"), "memory");
        assert_eq!(field(i, "key"), "job");
        assert_eq!(field(i, "backend_key"), "app:job");
    }
    assert_eq!(field(0, "outcome"), "acquired");
    assert_eq!(field(0, "fencing_token"), "1");
    assert_eq!(field(1, "outcome"), "contended");
    assert_eq!(field(2, "outcome"), "released");
    assert_eq!(field(3, "outcome"), "not_held");
    assert!(field(3, "error").starts_with("lock not held by this owner"));
    for span in &spans {
        assert!(
            span.fields.values().all(|v| !v.contains(&owner)),
            "owner token in {span:?}"
        );
    }
}

/// Over Redis, spans name the key as stored (prefix and hash tag) and metrics
/// carry the backend's name.
#[cfg(feature = "redis")]
#[test]
fn redis_operations_are_traced_with_their_redis_key_and_counted() {
    let server = test_servers::RedisServer::start();
    let capture = Capture::default();
    let recorder = DebuggingRecorder::new();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    tracing::subscriber::with_default(subscriber, || {
        metrics::with_local_recorder(&recorder, || {
            block_on(async {
                let locker = distlock::connect(&server.url())
                    .await
                    .unwrap()
                    .with_metrics()
                    .with_tracing();
                let lease = locker.try_lock("job", TTL).await.unwrap().unwrap();
                assert!(locker.try_lock("job", TTL).await.unwrap().is_none());
                lease.release().await.unwrap();
            })
        })
    });
    let spans: Vec<SpanRecord> = capture
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|(_, r)| r.clone())
        .collect();
    let ours: Vec<&SpanRecord> = spans
        .iter()
        .filter(|s| s.name.starts_with("distlock."))
        .collect();
    assert_eq!(ours.len(), 3, "{spans:?}");
    for span in &ours {
        assert_eq!(span.fields["backend"], "redis");
        assert_eq!(span.fields["key"], "job");
        assert_eq!(span.fields["backend_key"], "lock:{job}");
    }
    assert_eq!(ours[0].fields["outcome"], "acquired");
    assert_eq!(ours[1].fields["outcome"], "contended");
    assert_eq!(ours[2].fields["outcome"], "released");
    let (counters, histograms) = counters(&recorder);
    let count = |name: &str, pairs: &[(&str, &str)]| {
        counters.get(&(name.to_owned(), labels(pairs))).copied()
    };
    assert_eq!(
        count(
            "distlock_acquired_total",
            &[("backend", "redis"), ("operation", "try_lock")]
        ),
        Some(1)
    );
    assert_eq!(
        count(
            "distlock_contended_total",
            &[("backend", "redis"), ("operation", "try_lock")]
        ),
        Some(1)
    );
    assert_eq!(
        count(
            "distlock_releases_total",
            &[("backend", "redis"), ("outcome", "released")]
        ),
        Some(1)
    );
    assert_eq!(histograms.get("distlock_hold_duration_seconds"), Some(&1));
}
