//! The arithmetic of Redlock: majorities, the clock-drift allowance and a
//! grant's remaining validity, and the tally of the nodes' answers to one
//! call.

use std::fmt;
use std::time::Duration;

use crate::Error;

/// Redis expires keys with millisecond precision; antirez's description adds
/// 2 ms to the drift allowance for it, as redsync and node-redlock do.
const EXPIRY_PRECISION: Duration = Duration::from_millis(2);

/// The least number of nodes that is more than half of `nodes`.
pub(super) fn majority(nodes: usize) -> usize {
    nodes / 2 + 1
}

/// The clock-drift allowance for a lock of `ttl`: `ttl × factor + 2 ms`.
/// Never panics: an unrepresentable product (a factor out of range, which
/// the config refuses) counts as the whole ttl.
pub(super) fn drift(ttl: Duration, factor: f64) -> Duration {
    Duration::try_from_secs_f64(ttl.as_secs_f64() * factor)
        .unwrap_or(ttl)
        .saturating_add(EXPIRY_PRECISION)
}

/// What is left of a grant of `ttl` whose requests were sent `elapsed` ago,
/// after the drift allowance: `None` if nothing is.
pub(super) fn remaining_validity(
    ttl: Duration,
    elapsed: Duration,
    drift: Duration,
) -> Option<Duration> {
    ttl.checked_sub(elapsed)?.checked_sub(drift)
}

/// The answers of every node to one call: how many said yes, how many said
/// a definite no, and the failures (with the node they came from).
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) yes: usize,
    pub(super) no: usize,
    pub(super) failures: Vec<(String, Error)>,
}

impl Tally {
    /// Counts one node's answer.
    pub(super) fn count(&mut self, endpoint: &str, answer: crate::Result<bool>) {
        match answer {
            Ok(true) => self.yes += 1,
            Ok(false) => self.no += 1,
            Err(error) => self.failures.push((endpoint.to_owned(), error)),
        }
    }

    /// True if some failed call may have taken effect on its node.
    pub(super) fn outcome_unknown(&self) -> bool {
        self.failures.iter().any(|(_, e)| e.is_outcome_unknown())
    }

    /// True if the definite refusals leave no majority for yes, whatever
    /// the failed nodes would have said.
    pub(super) fn refused_by_majority(&self, nodes: usize) -> bool {
        self.no > nodes - majority(nodes)
    }
}

/// A call that did not reach a quorum of nodes: the error's source, naming
/// every node that failed and why. Its own source is the first failure.
#[derive(Debug)]
pub(super) struct QuorumFailure {
    pub(super) message: String,
    pub(super) failures: Vec<(String, Error)>,
}

impl QuorumFailure {
    /// `summary`, then each failed node and its error.
    pub(super) fn new(summary: String, failures: Vec<(String, Error)>) -> Self {
        let mut message = summary;
        for (endpoint, error) in &failures {
            message.push_str(&format!("; {endpoint}: {error}"));
        }
        QuorumFailure { message, failures }
    }
}

impl fmt::Display for QuorumFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for QuorumFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.failures
            .first()
            .map(|(_, e)| e as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn majorities() {
        let cases = [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (7, 4)];
        for (nodes, expected) in cases {
            assert_eq!(majority(nodes), expected, "{nodes} nodes");
        }
    }

    #[test]
    fn drift_is_one_percent_plus_two_milliseconds_by_default() {
        assert_eq!(
            drift(Duration::from_secs(10), 0.01),
            Duration::from_millis(102)
        );
        assert_eq!(
            drift(Duration::from_millis(400), 0.01),
            Duration::from_millis(6)
        );
        assert_eq!(
            drift(Duration::from_secs(10), 0.0),
            Duration::from_millis(2)
        );
        // Out-of-range factors cannot panic.
        assert_eq!(
            drift(Duration::from_secs(1), f64::NAN),
            Duration::from_millis(1002)
        );
        assert_eq!(drift(Duration::MAX, 2.0), Duration::MAX);
    }

    #[test]
    fn validity_is_ttl_less_elapsed_less_drift() {
        let ttl = Duration::from_secs(10);
        let drift = drift(ttl, 0.01);
        assert_eq!(
            remaining_validity(ttl, Duration::from_millis(50), drift),
            Some(Duration::from_millis(9848))
        );
        assert_eq!(
            remaining_validity(ttl, Duration::from_millis(9898), drift),
            Some(Duration::ZERO)
        );
        assert_eq!(
            remaining_validity(ttl, Duration::from_millis(9899), drift),
            None
        );
        assert_eq!(
            remaining_validity(ttl, Duration::from_secs(11), drift),
            None
        );
    }

    #[test]
    fn refusals_decide_only_when_no_majority_is_left() {
        let mut tally = Tally::default();
        tally.count("a", Ok(false));
        assert!(!tally.refused_by_majority(3));
        tally.count("b", Err(Error::backend("redis", "acquire", "down")));
        assert!(
            !tally.refused_by_majority(3),
            "the failed node might have said yes"
        );
        tally.count("c", Ok(false));
        assert!(tally.refused_by_majority(3));
        assert!(!tally.outcome_unknown());
        let five = Tally {
            no: 2,
            ..Tally::default()
        };
        assert!(!five.refused_by_majority(5));
    }
}
