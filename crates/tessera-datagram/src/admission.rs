//! Admission of sessions that peers open: how fast they may be opened (per source address and
//! in total), and which half-open sessions make room for newcomers.
//!
//! Opening a session costs a stranger one datagram and the endpoint a session's state, so
//! without limits a few thousand junk datagrams fill the session table and lock every real
//! client out. Three rules keep the table for peers that carry messages:
//!
//! - **Rate.** A session-opening packet is admitted only within two token buckets, one for its
//!   source IP address and one for the endpoint (GCRA: one number per bucket, the time at which
//!   it will be full again). Packets beyond either are dropped quietly, as if lost, so that an
//!   honest peer opens its session with a retransmission of its first packet. The endpoint's
//!   bucket binds only sources that are opening sessions already (their own bucket is less
//!   than half full): a quiet source, such as a client opening its one session, is never kept
//!   out by what other sources spent, else a flood from many addresses would lock it out as
//!   surely as a full table. Against sources forged by the thousand the endpoint's bucket
//!   does not help; the eviction of half-open sessions does.
//! - **Half-open sessions** (opened by a peer and not yet delivered a whole message) are at
//!   most `half_open_sessions_max`; a newcomer beyond that evicts the one silent longest, so
//!   a flood cannot keep out a real client, whose session completes its first message in a few
//!   round trips.
//! - **Expiry.** A half-open session silent for `half_open_timeout_us` is evicted.
//! - **Idle sessions.** An established session a peer opened and from which nothing arrives
//!   for `idle_timeout_us` is closed with a RESET, so that an authenticated peer that opens
//!   its address's share of sessions and goes silent keeps later sessions out for that long
//!   at most. A client whose idle session was closed learns it from the RESET (or, if that is
//!   lost, from the RESET that answers its next packet, which is then sent again on a new
//!   session), so a quiet but live client goes on working; sessions this endpoint opened
//!   never expire here.
//!
//! Everything here is sans-IO: time comes in as an argument.

use crate::Micros;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// Limits on the sessions peers open. See the module documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdmissionConfig {
    /// Sessions one source IP address may open per second, sustained.
    pub opens_per_second_per_source: u32,
    /// Sessions one source IP address may open at once after a quiet period.
    pub opens_burst_per_source: u32,
    /// Sessions all peers together may open per second, sustained.
    pub opens_per_second: u32,
    /// Sessions all peers together may open at once after a quiet period.
    pub opens_burst: u32,
    /// Source addresses whose opening rate is tracked; a new source beyond this is refused
    /// until the buckets of others have refilled (then they are forgotten).
    pub sources_max: usize,
    /// Half-open sessions (no message delivered yet) at most; a newcomer beyond this evicts
    /// the one silent longest.
    pub half_open_sessions_max: usize,
    /// A half-open session silent this long is evicted, µs.
    pub half_open_timeout_us: Micros,
    /// An established session a peer opened that sends nothing for this long, µs, is
    /// closed (a RESET tells the peer, which keys a new session when it next calls), so that
    /// sessions left idle never hold their address's share of the table for good.
    pub idle_timeout_us: Micros,
}

impl Default for AdmissionConfig {
    fn default() -> AdmissionConfig {
        AdmissionConfig {
            opens_per_second_per_source: 128,
            opens_burst_per_source: 64,
            opens_per_second: 4096,
            opens_burst: 1024,
            sources_max: 16_384,
            half_open_sessions_max: 1024,
            half_open_timeout_us: 1_000_000,
            // Three client request timeouts (10 s): an answer is never owed on a session
            // idle this long, since its caller gave up long before. Far above the RTO (at most
            // 200 ms) and the time after which a silent peer is lost (1 s).
            idle_timeout_us: 30_000_000,
        }
    }
}

impl AdmissionConfig {
    /// Whether every limit admits something: rates, bursts and bounds of at least 1.
    pub fn is_valid(&self) -> bool {
        self.opens_per_second_per_source >= 1
            && self.opens_burst_per_source >= 1
            && self.opens_per_second >= 1
            && self.opens_burst >= 1
            && self.sources_max >= 1
            && self.half_open_sessions_max >= 1
            && self.half_open_timeout_us >= 1
            && self.idle_timeout_us >= 1
    }
}

/// A token bucket as GCRA: `full_at` is when the bucket will hold `burst` tokens again.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    full_at: Micros,
}

/// Microseconds per token at `per_second`, and the whole burst's worth.
fn bucket_times(per_second: u32, burst: u32) -> (Micros, Micros) {
    let interval_us = (1_000_000 / per_second.max(1) as u64).max(1);
    (interval_us, interval_us * burst.max(1) as u64)
}

impl Bucket {
    /// Takes one token at `now` if the bucket has one.
    fn take(&mut self, now: Micros, per_second: u32, burst: u32) -> bool {
        let (interval_us, tolerance_us) = bucket_times(per_second, burst);
        let next = self.full_at.max(now) + interval_us;
        if next - now > tolerance_us {
            return false;
        }
        self.full_at = next;
        true
    }

    /// Whether at least half the burst is left at `now`.
    fn quiet(&self, now: Micros, per_second: u32, burst: u32) -> bool {
        let (_, tolerance_us) = bucket_times(per_second, burst);
        self.full_at <= now + tolerance_us / 2
    }
}

/// Why a session-opening packet was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Its source opened sessions faster than its bucket allows (or is one source too many).
    SourceRate,
    /// All peers together opened sessions faster than the endpoint's bucket allows.
    TotalRate,
}

/// The rate limits' state.
#[derive(Debug)]
pub(crate) struct Admission {
    total: Bucket,
    sources: BTreeMap<IpAddr, Bucket>,
}

impl Admission {
    pub(crate) fn new() -> Admission {
        Admission {
            total: Bucket { full_at: 0 },
            sources: BTreeMap::new(),
        }
    }

    /// Whether a session from `source` may open at `now`; takes a token from both buckets if so.
    pub(crate) fn admit(
        &mut self,
        source: IpAddr,
        now: Micros,
        config: &AdmissionConfig,
    ) -> Result<(), Refusal> {
        if !self.sources.contains_key(&source) && self.sources.len() >= config.sources_max {
            // Buckets that are full again say nothing the defaults would not.
            self.sources.retain(|_, bucket| bucket.full_at > now);
            if self.sources.len() >= config.sources_max {
                return Err(Refusal::SourceRate);
            }
        }
        let mut bucket = self
            .sources
            .get(&source)
            .copied()
            .unwrap_or(Bucket { full_at: 0 });
        let (per_second, burst) = (
            config.opens_per_second_per_source,
            config.opens_burst_per_source,
        );
        let quiet = bucket.quiet(now, per_second, burst);
        if !bucket.take(now, per_second, burst) {
            return Err(Refusal::SourceRate);
        }
        // A quiet source spends from the endpoint's bucket if it can, but is not refused by it.
        let total = self
            .total
            .take(now, config.opens_per_second, config.opens_burst);
        if !total && !quiet {
            return Err(Refusal::TotalRate);
        }
        self.sources.insert(source, bucket);
        assert!(self.sources.len() <= config.sources_max);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_admits_its_burst_then_its_rate() {
        let mut bucket = Bucket { full_at: 0 };
        let admitted = (0..100).filter(|_| bucket.take(0, 1000, 10)).count();
        assert_eq!(admitted, 10);
        // One more token per millisecond.
        assert!(bucket.take(1_000, 1000, 10));
        assert!(!bucket.take(1_000, 1000, 10));
        // After a quiet period the whole burst again, never more.
        let admitted = (0..100)
            .filter(|_| bucket.take(1_000_000, 1000, 10))
            .count();
        assert_eq!(admitted, 10);
    }

    #[test]
    fn one_source_cannot_spend_the_others_share() {
        let config = AdmissionConfig {
            opens_per_second_per_source: 10,
            opens_burst_per_source: 5,
            ..AdmissionConfig::default()
        };
        let mut admission = Admission::new();
        let flood: IpAddr = "10.0.0.1".parse().unwrap();
        let client: IpAddr = "10.0.0.2".parse().unwrap();
        let admitted = (0..1000)
            .filter(|_| admission.admit(flood, 0, &config).is_ok())
            .count();
        assert_eq!(admitted, 5);
        assert_eq!(admission.admit(client, 0, &config), Ok(()));
    }

    #[test]
    fn the_total_bucket_bounds_all_sources_together_and_sources_are_bounded() {
        let config = AdmissionConfig {
            opens_burst: 8,
            sources_max: 4,
            ..AdmissionConfig::default()
        };
        let mut admission = Admission::new();
        let source = |i: u8| IpAddr::from([10, 0, 0, i]);
        let results: Vec<_> = (0..6)
            .map(|i| admission.admit(source(i), 0, &config))
            .collect();
        assert_eq!(results[..4], [Ok(()), Ok(()), Ok(()), Ok(())]);
        assert_eq!(
            results[4],
            Err(Refusal::SourceRate),
            "a fifth source is not tracked"
        );
        // A second later every bucket is full again: the old sources are forgotten.
        assert_eq!(admission.admit(source(9), 1_000_000, &config), Ok(()));
        assert!(admission.sources.len() <= 4);
        // Three busy sources share the endpoint's burst of 8 (one went to source 9); their
        // first openings, while each is still quiet, do not count against it.
        let results: Vec<_> = (0..300u32)
            .map(|i| admission.admit(source((i % 3) as u8), 1_000_000, &config))
            .collect();
        let admitted = results.iter().filter(|r| r.is_ok()).count();
        assert!(admitted <= 3 * 32 + 8, "{admitted} beyond the total burst");
        assert!(results.contains(&Err(Refusal::TotalRate)));
    }

    #[test]
    fn a_quiet_source_is_admitted_when_busy_ones_spent_the_total() {
        let config = AdmissionConfig::default();
        let mut admission = Admission::new();
        let mut now = 0;
        for round in 0..10_000u32 {
            let busy = IpAddr::from([10, 1, (round % 64) as u8, 1]);
            let _ = admission.admit(busy, now, &config);
            now += 10;
        }
        let client: IpAddr = "10.0.0.2".parse().unwrap();
        assert_eq!(admission.admit(client, now, &config), Ok(()));
        // The busy sources themselves are held to the total.
        let busy = IpAddr::from([10, 1, 0, 1]);
        assert!(admission.admit(busy, now, &config).is_err());
    }
}
