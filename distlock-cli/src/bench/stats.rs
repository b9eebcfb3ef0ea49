//! Latency recording for the workloads: an HDR histogram per client (one
//! array increment per sample on the hot path), merged after the run.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Samples up to an hour, three significant digits (recording clamps
/// outliers to the bounds instead of failing).
pub(crate) struct Latencies(Histogram<u64>);

impl Latencies {
    pub(crate) fn new() -> Self {
        // Nanoseconds from 1 to an hour: constants hdrhistogram accepts
        // (low >= 1, high >= 2 * low, 3 significant figures), so this
        // cannot fail at run time.
        let histogram = Histogram::new_with_bounds(1, 3_600_000_000_000, 3)
            .expect("constant, valid histogram bounds");
        Latencies(histogram)
    }

    pub(crate) fn record(&mut self, sample: Duration) {
        let nanos = u64::try_from(sample.as_nanos()).unwrap_or(u64::MAX);
        self.0.saturating_record(nanos.max(1));
    }

    pub(crate) fn merge(&mut self, other: &Latencies) {
        // Same bounds on both sides: `add` only fails when other's values
        // exceed this one's range, which saturating recording prevents.
        let _ = self.0.add(&other.0);
    }

    pub(crate) fn len(&self) -> u64 {
        self.0.len()
    }

    pub(crate) fn summary(&self) -> Summary {
        let at = |quantile: f64| micros(self.0.value_at_quantile(quantile));
        if self.0.is_empty() {
            return Summary::default();
        }
        Summary {
            min: micros(self.0.min()),
            p50: at(0.5),
            p99: at(0.99),
            p999: at(0.999),
            max: micros(self.0.max()),
        }
    }
}

/// Quantiles of one latency, in microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct Summary {
    pub(crate) min: f64,
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) p999: f64,
    pub(crate) max: f64,
}

fn micros(nanos: u64) -> f64 {
    // One decimal: sub-100 ns differences are below the clock's noise here.
    (nanos as f64 / 100.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_of_known_samples() {
        let mut latencies = Latencies::new();
        for micros in 1..=1000u64 {
            latencies.record(Duration::from_micros(micros));
        }
        let summary = latencies.summary();
        assert_eq!(latencies.len(), 1000);
        assert!((summary.p50 - 500.0).abs() <= 1.0, "{summary:?}");
        assert!((summary.p99 - 990.0).abs() <= 1.0, "{summary:?}");
        assert!((summary.max - 1000.0).abs() <= 1.0, "{summary:?}");
    }

    #[test]
    fn empty_and_huge_samples_do_not_panic() {
        let mut latencies = Latencies::new();
        assert_eq!(latencies.summary().p50, 0.0);
        latencies.record(Duration::MAX);
        latencies.record(Duration::ZERO);
        let mut total = Latencies::new();
        total.merge(&latencies);
        assert_eq!(total.len(), 2);
    }
}
