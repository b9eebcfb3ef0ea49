//! Tracing as a wrapper: one span per operation.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tracing::field::Empty;
use tracing::{Instrument, Span};

use crate::forward::{forward_to_inner, inner_accessors};
use crate::inspect::{ForceRelease, HeldLock};
use crate::{Lease, Locker, MarkAdvance, RefreshRequest, ReleaseWatch, Result};

/// Wraps a [`Locker`] so every operation runs in a span named
/// `distlock.<operation>` (`distlock.try_lock`, `distlock.lock`,
/// `distlock.try_lock_any`, `distlock.try_lock_shared`, `distlock.lock_shared`, `distlock.unlock`,
/// `distlock.refresh`) at INFO level, with fields:
///
/// - `component = "distlock"`, `backend`;
/// - `key` (as the caller named it) and `backend_key` (as stored, after
///   prefixes and hash tags, see [`Locker::backend_key`]);
/// - `ttl_ms` / `timeout_ms` where the operation has them;
/// - `outcome`: `acquired`, `contended`, `released`, `refreshed`, or the error
///   kind ([`Error::kind_name`](crate::Error::kind_name)); `error` with the message on failure;
/// - `fencing_token` of a granted lease.
///
/// A keepalive batch ([`Locker::refresh_many`]) is one `distlock.refresh_many`
/// span with `leases` (the batch's size) and `refreshed` (how many were),
/// not a span per lease.
///
/// Owner tokens and passwords are never recorded.
///
/// ```
/// use distlock::LockerExt;
///
/// let locker = distlock::memory::MemoryLocker::new().with_tracing().shared();
/// # let _ = locker;
/// ```
#[derive(Debug)]
pub struct TraceLocker<L> {
    inner: Arc<L>,
    /// The `Arc` every lease granted through this wrapper (or a clone) shares.
    leases: crate::SharedLocker,
}

impl<L> Clone for TraceLocker<L> {
    fn clone(&self) -> Self {
        TraceLocker {
            inner: self.inner.clone(),
            leases: self.leases.clone(),
        }
    }
}

inner_accessors!(TraceLocker);

impl<L: Locker> TraceLocker<L> {
    /// Wraps `inner`.
    pub fn new(inner: L) -> Self {
        TraceLocker {
            inner: Arc::new(inner),
            leases: crate::SharedLocker::default(),
        }
    }

    /// Fills the fields every span has; skipped (no allocation) when the span
    /// is disabled.
    fn describe(&self, span: &Span, key: &str) {
        if !span.is_disabled() {
            span.record("backend_key", self.inner.backend_key(key));
        }
    }

    fn own(&self, lease: Lease, span: &Span) -> Lease {
        if let Some(token) = lease.fencing_token() {
            span.record("fencing_token", token);
        }
        lease.rebind(self.leases.get_or_init(|| Arc::new(self.clone())))
    }
}

/// An INFO span named `$name` with the fields of every operation on one key
/// (`component`, `backend`, `key`, `backend_key`, `outcome`, `error`) and
/// the `$extra` ones, its `backend_key` recorded: the span of each keyed
/// method below, whose fields would otherwise be listed seven times.
macro_rules! key_span {
    ($wrapper:expr, $name:literal, $key:expr $(, $($extra:tt)+)?) => {{
        let span = tracing::info_span!(
            $name,
            component = "distlock",
            backend = $wrapper.inner.backend(),
            key = $key,
            backend_key = Empty,
            outcome = Empty,
            error = Empty
            $(, $($extra)+)?
        );
        $wrapper.describe(&span, $key);
        span
    }};
}

/// Runs `operation` in `span` and records its outcome, as `named` names an
/// answer, or its error: the body every traced method shares.
async fn traced<T>(
    span: &Span,
    operation: impl Future<Output = Result<T>>,
    named: impl FnOnce(&T) -> &'static str,
) -> Result<T> {
    let result = operation.instrument(span.clone()).await;
    match &result {
        Ok(answer) => {
            span.record("outcome", named(answer));
        }
        Err(error) => {
            span.record("outcome", error.kind_name());
            span.record("error", tracing::field::display(error));
        }
    }
    result
}

fn acquired_or_contended(lease: &Option<Lease>) -> &'static str {
    match lease {
        Some(_) => "acquired",
        None => "contended",
    }
}

fn held_or_free(found: &Option<HeldLock>) -> &'static str {
    match found {
        Some(_) => "held",
        None => "free",
    }
}

// Every method is written out or named in `forward_to_inner!`: a method
// added to `Locker` must be decided on here, not silently left to its
// default (as object_store's wrapper stores do).
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<L: Locker> Locker for TraceLocker<L> {
    forward_to_inner!(backend, durability_warnings, capabilities, backend_key);

    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        let span = key_span!(
            self,
            "distlock.try_lock",
            key,
            ttl_ms = ttl.as_millis() as u64,
            fencing_token = Empty,
        );
        let lease = traced(&span, self.inner.try_lock(key, ttl), acquired_or_contended).await?;
        Ok(lease.map(|lease| self.own(lease, &span)))
    }

    async fn lock(&self, key: &str, ttl: Duration, timeout: Duration) -> Result<Lease> {
        let span = key_span!(
            self,
            "distlock.lock",
            key,
            ttl_ms = ttl.as_millis() as u64,
            timeout_ms = timeout.as_millis() as u64,
            fencing_token = Empty,
        );
        let lease = traced(&span, self.inner.lock(key, ttl, timeout), |_| "acquired").await?;
        Ok(self.own(lease, &span))
    }

    /// One span for the whole attempt: `key` is the first key tried (the
    /// one its `backend_key` names), `keys` how many, and `granted` the key
    /// taken, if any.
    async fn try_lock_any(&self, keys: &[String], ttl: Duration) -> Result<Option<Lease>> {
        let first = keys.first().map_or("", String::as_str);
        let span = key_span!(
            self,
            "distlock.try_lock_any",
            first,
            keys = keys.len() as u64,
            granted = Empty,
            ttl_ms = ttl.as_millis() as u64,
            fencing_token = Empty,
        );
        let lease = traced(&span, self.inner.try_lock_any(keys, ttl), |lease| {
            if let Some(lease) = lease {
                span.record("granted", lease.key());
            }
            acquired_or_contended(lease)
        })
        .await?;
        Ok(lease.map(|lease| self.own(lease, &span)))
    }

    async fn try_lock_shared(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        let span = key_span!(
            self,
            "distlock.try_lock_shared",
            key,
            ttl_ms = ttl.as_millis() as u64,
            fencing_token = Empty,
        );
        let operation = self.inner.try_lock_shared(key, ttl);
        let lease = traced(&span, operation, acquired_or_contended).await?;
        Ok(lease.map(|lease| self.own(lease, &span)))
    }

    async fn lock_shared(&self, key: &str, ttl: Duration, timeout: Duration) -> Result<Lease> {
        let span = key_span!(
            self,
            "distlock.lock_shared",
            key,
            ttl_ms = ttl.as_millis() as u64,
            timeout_ms = timeout.as_millis() as u64,
            fencing_token = Empty,
        );
        let operation = self.inner.lock_shared(key, ttl, timeout);
        let lease = traced(&span, operation, |_| "acquired").await?;
        Ok(self.own(lease, &span))
    }

    async fn unlock(&self, key: &str, owner: &str) -> Result<()> {
        let span = key_span!(self, "distlock.unlock", key);
        traced(&span, self.inner.unlock(key, owner), |()| "released").await
    }

    async fn forget(&self, key: &str) -> Result<()> {
        let span = key_span!(self, "distlock.forget", key);
        traced(&span, self.inner.forget(key), |()| "forgotten").await
    }

    async fn advance_mark(&self, name: &str, value: i64) -> Result<MarkAdvance> {
        let span = tracing::info_span!(
            "distlock.advance_mark",
            component = "distlock",
            backend = self.inner.backend(),
            name,
            value,
            outcome = Empty,
            error = Empty
        );
        traced(
            &span,
            self.inner.advance_mark(name, value),
            |advance| match advance {
                MarkAdvance::Advanced { .. } => "advanced",
                MarkAdvance::AlreadyAt { .. } => "already_at",
            },
        )
        .await
    }

    async fn refresh(&self, key: &str, owner: &str, ttl: Duration) -> Result<()> {
        let span = key_span!(
            self,
            "distlock.refresh",
            key,
            ttl_ms = ttl.as_millis() as u64,
        );
        traced(&span, self.inner.refresh(key, owner, ttl), |()| "refreshed").await
    }
    /// One span for the batch, with its size and how many were refreshed.
    async fn refresh_many(&self, requests: &[RefreshRequest<'_>]) -> Vec<Result<()>> {
        let span = tracing::info_span!(
            "distlock.refresh_many",
            component = "distlock",
            backend = self.inner.backend(),
            leases = requests.len(),
            refreshed = Empty,
        );
        let results = self
            .inner
            .refresh_many(requests)
            .instrument(span.clone())
            .await;
        span.record(
            "refreshed",
            results.iter().filter(|result| result.is_ok()).count(),
        );
        results
    }

    async fn watch_releases(&self, key: &str) -> Result<Option<ReleaseWatch>> {
        self.inner.watch_releases(key).await
    }

    async fn inspect(&self, key: &str) -> Result<Option<HeldLock>> {
        let span = key_span!(self, "distlock.inspect", key);
        traced(&span, self.inner.inspect(key), held_or_free).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let span = tracing::info_span!(
            "distlock.list",
            component = "distlock",
            backend = self.inner.backend(),
            prefix,
            count = Empty,
            outcome = Empty,
            error = Empty
        );
        traced(&span, self.inner.list(prefix), |listed| {
            span.record("count", listed.len());
            "listed"
        })
        .await
    }

    /// The span also carries the evicted holder's fencing token.
    async fn force_release(&self, key: &str, how: ForceRelease) -> Result<Option<HeldLock>> {
        let span = key_span!(
            self,
            "distlock.force_release",
            key,
            method = ?how,
            fencing_token = Empty,
        );
        traced(&span, self.inner.force_release(key, how), |evicted| {
            if let Some(token) = evicted.as_ref().and_then(|held| held.fencing_token) {
                span.record("fencing_token", token);
            }
            held_or_free(evicted)
        })
        .await
    }
}
