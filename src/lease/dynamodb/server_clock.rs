//! The table server's clock, as the `Date` header of its answers gives it,
//! for `leaderd check`: a store whose client notes, for every answer, the
//! header and this host's wall clock just before the request left and just
//! after the answer came.
//!
//! The SDK's operation outputs carry no HTTP headers, so an interceptor on
//! the client reads them from the raw answer, whatever the answer is: an
//! error (a denied call, a missing table) has a `Date` too.

use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::interceptors::{
    BeforeDeserializationInterceptorContextRef, BeforeTransmitInterceptorContextRef,
};
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::primitives::{DateTime, DateTimeFormat};

use super::{DynamoConfig, DynamoStore};
use crate::clock::unix_ms;

/// One answer's `Date` and this host's wall clock around its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatedAnswer {
    /// The `Date` header, in unix seconds: the server's clock, cut to the
    /// second, at some instant while it answered.
    pub date_s: i64,
    /// This host's wall clock (unix ms) just before the request was sent.
    pub sent_ms: u64,
    /// This host's wall clock (unix ms) just after the answer arrived.
    pub received_ms: u64,
}

impl DatedAnswer {
    /// How far this host's wall clock is ahead of the server's (negative:
    /// behind), in ms, as `(least, most)`: the server's clock read at some
    /// instant in `[date_s, date_s + 1 s)`, and that instant lies between
    /// `sent_ms` and `received_ms` on this host's clock.
    pub fn skew_bounds_ms(&self) -> (i64, i64) {
        let date_ms = self.date_s.saturating_mul(1000);
        let sent = i64::try_from(self.sent_ms).unwrap_or(i64::MAX);
        let received = i64::try_from(self.received_ms).unwrap_or(i64::MAX);
        (
            sent.saturating_sub(date_ms.saturating_add(1000)),
            received.saturating_sub(date_ms),
        )
    }
}

/// The answers' dates a store's client noted; clones share them. The best
/// one is kept: the answer with the shortest round trip bounds the skew
/// most tightly.
#[derive(Debug, Clone, Default)]
pub struct ServerClock {
    inner: Arc<Mutex<Noted>>,
}

#[derive(Debug, Default)]
struct Noted {
    /// The wall clock when the request in flight was sent. Requests are
    /// made one at a time by `leaderd check`, the only user.
    sent_ms: Option<u64>,
    best: Option<DatedAnswer>,
    /// Answers that came without a readable `Date` header.
    undated: u32,
}

impl ServerClock {
    /// The answer with the shortest round trip, if any had a `Date`.
    pub fn best(&self) -> Option<DatedAnswer> {
        self.lock().best
    }

    /// How many answers came without a readable `Date` header.
    pub fn undated(&self) -> u32 {
        self.lock().undated
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Noted> {
        // Nothing here can panic while the lock is held; a poisoned lock
        // still holds consistent data.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn note(&self, date: Option<&str>) {
        let received_ms = unix_ms();
        let mut noted = self.lock();
        let sent_ms = noted.sent_ms.take().unwrap_or(received_ms);
        let date_s = date.and_then(|d| DateTime::from_str(d.trim(), DateTimeFormat::HttpDate).ok());
        let Some(date_s) = date_s.map(|d| d.secs()) else {
            noted.undated += 1;
            return;
        };
        let answer = DatedAnswer {
            date_s,
            sent_ms,
            received_ms,
        };
        let round_trip = |a: &DatedAnswer| a.received_ms.saturating_sub(a.sent_ms);
        if noted
            .best
            .is_none_or(|best| round_trip(&answer) < round_trip(&best))
        {
            noted.best = Some(answer);
        }
    }
}

impl Intercept for ServerClock {
    fn name(&self) -> &'static str {
        "leaderd::ServerClock"
    }

    fn read_before_transmit(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        self.lock().sent_ms = Some(unix_ms());
        Ok(())
    }

    fn read_after_transmit(
        &self,
        context: &BeforeDeserializationInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        self.note(context.response().headers().get("date"));
        Ok(())
    }
}

impl DynamoStore {
    /// A store like [`DynamoStore::new`]'s whose every answer's `Date` is
    /// noted in the returned [`ServerClock`].
    pub async fn with_server_clock(cfg: &DynamoConfig) -> (DynamoStore, ServerClock) {
        let store = DynamoStore::new(cfg).await;
        let clock = ServerClock::default();
        let config = store
            .client
            .config()
            .to_builder()
            .interceptor(clock.clone())
            .build();
        let store = DynamoStore {
            client: Client::from_conf(config),
            ..store
        };
        (store, clock)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skew_bounds_cover_the_date_s_second_and_the_round_trip() {
        // Sent at .200, answered at .400 of the second after the Date's:
        // the server read its clock in [100.000, 101.000), this host's was
        // then in [101.200, 101.400].
        let a = DatedAnswer {
            date_s: 100,
            sent_ms: 101_200,
            received_ms: 101_400,
        };
        assert_eq!(a.skew_bounds_ms(), (200, 1_400));
        let behind = DatedAnswer {
            date_s: 3_700,
            sent_ms: 100_000,
            received_ms: 100_050,
        };
        assert_eq!(behind.skew_bounds_ms(), (-3_601_000, -3_599_950));
    }

    #[test]
    fn the_shortest_round_trip_is_kept_and_bad_dates_are_counted() {
        let clock = ServerClock::default();
        clock.note(Some("Sun, 06 Nov 1994 08:49:37 GMT"));
        clock.note(Some("not a date"));
        clock.note(None);
        assert_eq!(clock.undated(), 2);
        let best = clock.best().expect("one dated answer");
        assert_eq!(best.date_s, 784_111_777);
    }
}
