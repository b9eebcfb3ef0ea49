//! How fast each side of a Postgres connection notices a silent peer: the
//! TCP keepalive and user-timeout arithmetic the builder's settings and the
//! lease's server window are computed from.

use std::time::Duration;

/// TCP keepalive and user-timeout settings for one side of a connection.
///
/// A silent peer (host down, network partition) is detected after about
/// `idle + interval × retries` without traffic, or after `user_timeout` when
/// data sent to it stays unacknowledged. The kernel defaults (2 hours idle)
/// would let a dead holder's lock stand for hours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpKeepalive {
    /// Silence before the first probe.
    pub idle: Duration,
    /// Time between probes.
    pub interval: Duration,
    /// Unanswered probes before the connection is dropped.
    pub retries: u32,
    /// How long sent data may stay unacknowledged (`TCP_USER_TIMEOUT`).
    pub user_timeout: Duration,
}

impl TcpKeepalive {
    /// This client's side: idle 1 s, every 1 s, 3 probes, user timeout 4 s:
    /// a silent server is declared dead at most 4 s after the last segment
    /// heard from it ([`latest_detection`](Self::latest_detection)).
    ///
    /// It only speeds up noticing the death of a direct connection: the
    /// bound a holder relies on comes from the pings, which a proxy between
    /// client and server cannot answer in the server's place (see
    /// [`PostgresLocker`](crate::postgres::PostgresLocker)'s "Lost locks" and
    /// [`PostgresLockerBuilder::ping_timeout`](super::PostgresLockerBuilder::ping_timeout)).
    pub const CLIENT: TcpKeepalive = TcpKeepalive {
        idle: Duration::from_secs(1),
        interval: Duration::from_secs(1),
        retries: 3,
        user_timeout: Duration::from_secs(4),
    };

    /// The server's side, set per session: idle 2 s, every 2 s, 5 probes,
    /// user timeout 12 s: a vanished holder's locks are freed 12 s after the
    /// server last heard from it, which is at most 2 s before the holder
    /// went silent (the server's own probes are answered until then), so
    /// 10 to 12 s after.
    pub const SERVER: TcpKeepalive = TcpKeepalive {
        idle: Duration::from_secs(2),
        interval: Duration::from_secs(2),
        retries: 5,
        user_timeout: Duration::from_secs(12),
    };

    /// About how long a silent peer takes to be declared dead: the later of
    /// the two ways ([`latest_detection`](Self::latest_detection), ignoring
    /// a zero `user_timeout`).
    pub fn detection_time(&self) -> Duration {
        self.probes_time().max(self.user_timeout)
    }

    /// `idle + interval × retries`: when unanswered keepalive probes give
    /// up, counted from the last segment heard from the peer.
    fn probes_time(&self) -> Duration {
        self.idle
            .saturating_add(self.interval.saturating_mul(self.retries))
    }

    /// The soonest this side can declare a silent peer dead:
    /// `min(user_timeout, idle + interval × retries)` (Linux's
    /// `TCP_USER_TIMEOUT` also cuts keepalive probing short, tcp(7)). A zero
    /// `user_timeout` means the kernel default (none): probes only.
    pub fn earliest_detection(&self) -> Duration {
        if self.user_timeout.is_zero() {
            return self.probes_time();
        }
        self.probes_time().min(self.user_timeout)
    }

    /// The latest this side declares a silent peer dead, whether it was
    /// idle (probes) or sending (`user_timeout`):
    /// `max(user_timeout, idle + interval × retries)`. `None` with a zero
    /// `user_timeout`: unacknowledged data is then retransmitted for the
    /// kernel's `tcp_retries2` (about 15 minutes), which is no bound to
    /// build on.
    pub fn latest_detection(&self) -> Option<Duration> {
        (!self.user_timeout.is_zero()).then(|| self.probes_time().max(self.user_timeout))
    }
}

/// See `Settings::server_window`.
pub(super) fn server_window(
    server_keepalive: Option<TcpKeepalive>,
    idle_session_timeout: Option<Duration>,
) -> Duration {
    let Some(server) = server_keepalive else {
        return Duration::ZERO;
    };
    let keepalive = server.earliest_detection().saturating_sub(server.idle);
    match idle_session_timeout {
        Some(idle) => keepalive.min(idle),
        None => keepalive,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keepalive_detection_time() {
        assert_eq!(
            TcpKeepalive::CLIENT.detection_time(),
            Duration::from_secs(4)
        );
        assert_eq!(
            TcpKeepalive::SERVER.detection_time(),
            Duration::from_secs(12)
        );
    }
}
