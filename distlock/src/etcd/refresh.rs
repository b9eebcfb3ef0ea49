//! Refresh: whether a grant's key still holds it (its create revision and
//! secret), one compare transaction per lease, or read-only transactions
//! of up to 128 reads for a keepalive batch.

use std::time::Duration;

use super::owner::SecretAt;
use super::recipe::{self, Token};
use super::{EtcdLocker, Slot};
use crate::{validate, Error, RefreshRequest, Result};

/// The most [`Locker::refresh_many`] transactions of one batch on their way
/// at once: enough to keep a round trip's worth of reads going, few enough
/// that the answers of a 100,000-lease batch (every key's value) are not
/// all buffered at once.
const REFRESH_TXNS_IN_FLIGHT: usize = 4;

impl EtcdLocker {
    /// [`Locker::refresh`](crate::Locker::refresh): one compare
    /// transaction on the grant's key (and owner key).
    pub(super) async fn refresh_grant(&self, key: &str, owner: &str, ttl: Duration) -> Result<()> {
        let (contender, token) = self.grant_to_check(key, owner, ttl)?;
        let at = self.secret_at(key, &token);
        let ours = self
            .inner
            .request("refresh", false, || {
                recipe::still_ours(
                    self.inner.kv(),
                    &contender,
                    token.revision,
                    &token.secret,
                    &at,
                )
            })
            .await?;
        Error::unless_held(key, ours)
    }

    /// [`Locker::refresh_many`](crate::Locker::refresh_many): chunks of
    /// [`recipe::MAX_TXN_OPS`] leases, [`REFRESH_TXNS_IN_FLIGHT`] at a time.
    pub(super) async fn refresh_grants(&self, requests: &[RefreshRequest<'_>]) -> Vec<Result<()>> {
        let mut answers = Vec::with_capacity(requests.len());
        for wave in requests.chunks(recipe::MAX_TXN_OPS * REFRESH_TXNS_IN_FLIGHT) {
            let chunks = wave.chunks(recipe::MAX_TXN_OPS);
            let answered =
                futures_util::future::join_all(chunks.map(|chunk| self.refresh_chunk(chunk))).await;
            answers.extend(answered.into_iter().flatten());
        }
        answers
    }

    /// The contender key and token a refresh of `key` by `owner` reads, or
    /// its answer when no read is needed: the request is invalid, the token
    /// is not one of ours, or its session has ended (its lease is gone).
    fn grant_to_check(&self, key: &str, owner: &str, ttl: Duration) -> Result<(String, Token)> {
        validate::acquire(key, ttl)?;
        let not_held = || Error::not_held(key);
        let token = Token::parse(owner).ok_or_else(not_held)?;
        let name = self.name(key);
        let contender = token.key(&name);
        if self
            .inner
            .registry
            .session_of(&Slot::of(name, token.role), owner)
            .is_some_and(|session| session.is_closed())
        {
            return Err(not_held());
        }
        Ok((contender, token))
    }

    /// [`Locker::refresh_many`] of at most [`recipe::MAX_TXN_OPS`] leases:
    /// the ones that need a read are read in one transaction (two when
    /// election candidates' owner keys take the reads past 128).
    async fn refresh_chunk(&self, requests: &[RefreshRequest<'_>]) -> Vec<Result<()>> {
        let checks: Vec<Result<(String, Token, SecretAt)>> = requests
            .iter()
            .map(|request| {
                let (contender, token) =
                    self.grant_to_check(request.key, request.owner, request.ttl)?;
                let at = self.secret_at(request.key, &token);
                Ok((contender, token, at))
            })
            .collect();
        let grants: Vec<recipe::Grant<'_>> = checks
            .iter()
            .filter_map(|check| check.as_ref().ok())
            .map(|(contender, token, at)| recipe::Grant {
                key: contender,
                revision: token.revision,
                secret: &token.secret,
                at,
            })
            .collect();
        let read = if grants.is_empty() {
            Ok(Vec::new())
        } else {
            self.inner
                .request("refresh", false, || {
                    recipe::still_ours_many(self.inner.kv(), &grants)
                })
                .await
        };
        let mut ours = read.as_deref().unwrap_or_default().iter();
        checks
            .into_iter()
            .zip(requests)
            .map(|(check, request)| match (check, &read) {
                (Err(answer), _) => Err(answer),
                (Ok(_), Ok(_)) => {
                    Error::unless_held(request.key, ours.next().copied().unwrap_or(false))
                }
                (Ok(_), Err(error)) => Err(error.duplicate()),
            })
            .collect()
    }
}
