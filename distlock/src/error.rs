//! The one error type every backend and wrapper returns.

use std::time::Duration;

/// A boxed error from a client library (redis-rs, tokio-postgres, the OS, ...).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure distlock reports, whatever the backend.
///
/// The variants are the contract: classifying an error never depends on which
/// backend produced it. In particular an outage ([`Error::Backend`],
/// [`Error::Unavailable`]) is never reported as contention ([`Error::NotAcquired`],
/// [`Error::Timeout`]), so a caller can tell "somebody else has the lock" from
/// "I cannot tell who has the lock".
///
/// ```
/// use distlock::Error;
///
/// fn http_status(err: &Error) -> u16 {
///     match err {
///         Error::NotAcquired { .. } | Error::Timeout { .. } => 409,
///         Error::NotHeld { .. } => 410,
///         Error::InvalidInput { .. } => 400,
///         Error::Unavailable { .. } | Error::Backend { .. } => 503,
///         _ => 500,
///     }
/// }
/// assert_eq!(http_status(&Error::NotHeld { key: "k".into() }), 410);
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock is held elsewhere: a single attempt (or `lock` with a zero
    /// timeout) found it taken. This is a healthy answer from the backend.
    #[error("lock not acquired: {key:?} is held elsewhere")]
    NotAcquired {
        /// The key as the caller named it.
        key: String,
    },

    /// `lock` waited for `waited` and the lock stayed held elsewhere.
    #[error("lock acquire timeout: {key:?} still held elsewhere after {waited:?}")]
    Timeout {
        /// The key as the caller named it.
        key: String,
        /// How long the caller waited.
        waited: Duration,
    },

    /// Release or refresh by an owner that does not hold the lock (it expired,
    /// was taken over, or was already released). Nothing was deleted or
    /// extended. A holder that sees this must stop working in its critical
    /// section: somebody else may be in it.
    #[error("lock not held by this owner: {key:?}")]
    NotHeld {
        /// The key as the caller named it.
        key: String,
    },

    /// The backend is known to be down (for example the circuit breaker is
    /// open) and the call was not attempted.
    #[error("{backend} backend unavailable: {reason}")]
    Unavailable {
        /// Backend name (`"redis"`, `"postgres"`, ...).
        backend: &'static str,
        /// Why it is considered unavailable.
        reason: String,
    },

    /// The caller passed something unusable: an empty or oversized key, a zero
    /// ttl, a malformed URL, an unsupported scheme. Retrying will not help.
    #[error("invalid {what}: {reason}")]
    InvalidInput {
        /// What was wrong (`"key"`, `"ttl"`, `"url"`, ...).
        what: &'static str,
        /// A sentence saying why, naming the offending value where safe.
        reason: String,
    },

    /// The backend cannot do this at all (for example releasing a `flock` held
    /// by another process). Retrying will not help.
    #[error("{backend} backend cannot {operation}: {reason}")]
    Unsupported {
        /// Backend name.
        backend: &'static str,
        /// The operation that was asked for.
        operation: &'static str,
        /// Why it is impossible, and what to do instead.
        reason: String,
    },

    /// The lock was lost while the guarded work ran ([`crate::with_lock`],
    /// [`crate::WithLock::run`]): the work was stopped (dropped) before it
    /// finished, because the lease could no longer be relied on. Also
    /// returned by [`crate::Lease::refresh`] on a lease already known lost.
    #[error("lock {key:?} lost: {reason}")]
    Lost {
        /// The key as the caller named it.
        key: String,
        /// Why the lease was lost.
        reason: crate::LostReason,
    },

    /// A call to the backend did not finish within its time bound (a
    /// release past its release timeout, a statement past the query
    /// timeout, an acquire past its deadline plus [`crate::DEADLINE_GRACE`]).
    /// The call was abandoned; what it did on the server is unknown (an
    /// abandoned acquire is undone in the background). The seed's
    /// "deadline exceeded" classification: match it to tell a slow backend
    /// from a refusing one.
    #[error("{backend} backend did not finish {operation} within {after:?}")]
    DeadlineExceeded {
        /// Backend name.
        backend: &'static str,
        /// The operation that was abandoned.
        operation: &'static str,
        /// The bound it ran under.
        after: Duration,
    },

    /// The backend or the transport to it failed. The client library's error
    /// is kept whole as the [`source`](std::error::Error::source).
    #[error("{backend} backend failed during {operation}: {source}")]
    Backend {
        /// Backend name.
        backend: &'static str,
        /// The operation that failed (`"acquire"`, `"release"`, `"connect"`, ...).
        operation: &'static str,
        /// The call may have taken effect on the server (its request was
        /// sent, its answer never arrived): see [`Error::is_outcome_unknown`].
        outcome_unknown: bool,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
}

impl Error {
    /// Builds an [`Error::InvalidInput`].
    pub fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidInput {
            what,
            reason: reason.into(),
        }
    }

    /// Builds an [`Error::NotAcquired`] for `key`: held by another owner.
    pub(crate) fn not_acquired(key: &str) -> Self {
        Error::NotAcquired {
            key: key.to_owned(),
        }
    }

    /// Builds an [`Error::NotHeld`] for `key`: the caller's owner token does
    /// not hold it (any more).
    pub(crate) fn not_held(key: &str) -> Self {
        Error::NotHeld {
            key: key.to_owned(),
        }
    }

    /// A release's or refresh's answer once the backend said whether the
    /// caller's owner token `held` `key`: `Ok(())`, or
    /// [`not_held`](Self::not_held).
    pub(crate) fn unless_held(key: &str, held: bool) -> Result<()> {
        if held {
            Ok(())
        } else {
            Err(Error::not_held(key))
        }
    }

    /// Builds an [`Error::Unsupported`]: `backend` cannot do `operation`
    /// at all, for `reason` (which should say what to do instead). Retrying
    /// never helps, so callers and [`Error::is_outage`] treat it as final.
    ///
    /// ```
    /// use distlock::Error;
    /// let refused = Error::unsupported("file", "force_release", "only the holding process can");
    /// assert_eq!(refused.kind_name(), "unsupported");
    /// assert_eq!(
    ///     refused.to_string(),
    ///     "file backend cannot force_release: only the holding process can"
    /// );
    /// ```
    pub fn unsupported(
        backend: &'static str,
        operation: &'static str,
        reason: impl Into<String>,
    ) -> Self {
        Error::Unsupported {
            backend,
            operation,
            reason: reason.into(),
        }
    }

    /// Builds an [`Error::Backend`] from any error.
    pub fn backend(
        backend: &'static str,
        operation: &'static str,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::Backend {
            backend,
            operation,
            outcome_unknown: false,
            source: source.into(),
        }
    }

    /// The same error, marked as one whose call may have taken effect on the
    /// server (an acquire sent whose answer never came): a backend error
    /// gets [`outcome_unknown`](Error::Backend::outcome_unknown) set; other
    /// kinds are returned as they are ([`Error::DeadlineExceeded`] is unknown
    /// by nature).
    pub fn with_outcome_unknown(mut self) -> Self {
        if let Error::Backend {
            outcome_unknown, ..
        } = &mut self
        {
            *outcome_unknown = true;
        }
        self
    }

    /// True when the failed call may nevertheless have taken effect on the
    /// server: a call abandoned at its time bound
    /// ([`Error::DeadlineExceeded`]), or a backend error whose request was
    /// sent but whose answer was lost. For an acquire, the backends undo
    /// such an attempt by its owner token in the background; a caller that
    /// retries should expect the lock to be briefly held by nobody.
    ///
    /// ```
    /// use distlock::Error;
    /// let lost_reply = Error::backend("redis", "acquire", "connection reset").with_outcome_unknown();
    /// assert!(lost_reply.is_outcome_unknown() && lost_reply.is_outage());
    /// assert!(!Error::backend("redis", "acquire", "connection refused").is_outcome_unknown());
    /// ```
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(
            self,
            Error::DeadlineExceeded { .. }
                | Error::Backend {
                    outcome_unknown: true,
                    ..
                }
        )
    }

    /// True for the two contention answers: [`Error::NotAcquired`] and
    /// [`Error::Timeout`]. Contention means the backend answered.
    pub fn is_contention(&self) -> bool {
        matches!(self, Error::NotAcquired { .. } | Error::Timeout { .. })
    }

    /// True when the backend could not be reached, failed or did not answer
    /// in time ([`Error::Backend`], [`Error::DeadlineExceeded`] or
    /// [`Error::Unavailable`]): the state of the lock is unknown and a later
    /// retry may succeed.
    pub fn is_outage(&self) -> bool {
        matches!(
            self,
            Error::Backend { .. } | Error::DeadlineExceeded { .. } | Error::Unavailable { .. }
        )
    }

    /// A short, stable, low-cardinality name for the kind of error, used as a
    /// metrics label and span field.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Error::NotAcquired { .. } => "not_acquired",
            Error::Timeout { .. } => "timeout",
            Error::NotHeld { .. } => "not_held",
            Error::Unavailable { .. } => "unavailable",
            Error::InvalidInput { .. } => "invalid_input",
            Error::Unsupported { .. } => "unsupported",
            Error::Lost { .. } => "lost",
            Error::DeadlineExceeded { .. } => "deadline_exceeded",
            Error::Backend { .. } => "backend_error",
        }
    }

    /// A copy of this error for another of the requests it failed (a batch
    /// that failed as a whole fails each of its requests): the same kind and
    /// fields, the source kept as its message.
    #[cfg_attr(
        not(any(feature = "postgres", feature = "etcd", feature = "mysql")),
        allow(dead_code)
    )]
    pub(crate) fn duplicate(&self) -> Self {
        match self {
            Error::NotAcquired { key } => Error::NotAcquired { key: key.clone() },
            Error::Timeout { key, waited } => Error::Timeout {
                key: key.clone(),
                waited: *waited,
            },
            Error::NotHeld { key } => Error::NotHeld { key: key.clone() },
            Error::Unavailable { backend, reason } => Error::Unavailable {
                backend,
                reason: reason.clone(),
            },
            Error::InvalidInput { what, reason } => Error::InvalidInput {
                what,
                reason: reason.clone(),
            },
            Error::Unsupported {
                backend,
                operation,
                reason,
            } => Error::Unsupported {
                backend,
                operation,
                reason: reason.clone(),
            },
            Error::Lost { key, reason } => Error::Lost {
                key: key.clone(),
                reason: *reason,
            },
            Error::DeadlineExceeded {
                backend,
                operation,
                after,
            } => Error::DeadlineExceeded {
                backend,
                operation,
                after: *after,
            },
            Error::Backend {
                backend,
                operation,
                outcome_unknown,
                source,
            } => Error::Backend {
                backend,
                operation,
                outcome_unknown: *outcome_unknown,
                source: source.to_string().into(),
            },
        }
    }

    /// Returns the same error with every key field rewritten by `f`; wrappers
    /// that rename keys (such as [`crate::PrefixLocker`]) use it so errors name the
    /// key the caller used.
    pub(crate) fn map_key(self, f: impl FnOnce(String) -> String) -> Self {
        match self {
            Error::NotAcquired { key } => Error::NotAcquired { key: f(key) },
            Error::Timeout { key, waited } => Error::Timeout {
                key: f(key),
                waited,
            },
            Error::NotHeld { key } => Error::NotHeld { key: f(key) },
            Error::Lost { key, reason } => Error::Lost {
                key: f(key),
                reason,
            },
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_carry_the_contract_wording() {
        let e = Error::NotAcquired { key: "a".into() };
        assert!(e.to_string().starts_with("lock not acquired"));
        let e = Error::Timeout {
            key: "a".into(),
            waited: Duration::from_millis(5),
        };
        assert!(e.to_string().starts_with("lock acquire timeout"));
        let e = Error::NotHeld { key: "a".into() };
        assert!(e.to_string().starts_with("lock not held by this owner"));
    }

    #[test]
    fn outage_is_never_contention() {
        let outage = Error::backend("redis", "acquire", "connection refused");
        assert!(outage.is_outage());
        assert!(!outage.is_contention());
        let busy = Error::NotAcquired { key: "k".into() };
        assert!(busy.is_contention());
        assert!(!busy.is_outage());
    }

    #[test]
    fn map_key_rewrites_only_key_fields() {
        let e = Error::NotHeld { key: "p:k".into() }.map_key(|k| k[2..].to_string());
        assert!(matches!(e, Error::NotHeld { key } if key == "k"));
        let e = Error::invalid("ttl", "zero").map_key(|_| unreachable!());
        assert_eq!(e.kind_name(), "invalid_input");
    }
}
