//! Reserved streams (Radon, issue 18): a read or write of one file at a reserved rate over a
//! period, each period's bytes due by its end.
//!
//! [`StreamLedger`] is the bookkeeping, with time passed in (µs since the stream started):
//! when the transfer loop may start a chunk (each period's bytes at the period's start, so a
//! client never moves more than it reserved), and, as chunks complete in order,
//! which periods met their deadline and how late the others were. Over the datagram
//! transport the sessions the client opens are reserved at the same rate as well
//! ([`crate::ClientConfig::reservation`]), which paces their packets by Radon's percent
//! budget; over TCP the chunk pacing is all there is. Every request of a reserved client
//! carries the end of its period as its deadline ([`ServiceClock`]), and the servers serve
//! it earliest deadline first, ahead of best effort (`tessera_server::schedule`).

use crate::{Client, ClientError, File};
use serde::{Deserialize, Serialize};
use std::time::Duration;
pub use tessera_datagram::Reservation;
use tessera_wire::{ManagerRequest, ManagerResponse, Service};

/// How a client's requests ask the servers to order them.
#[derive(Clone, Debug)]
pub(crate) enum ServiceClock {
    /// Unreserved.
    BestEffort,
    /// A reserved stream: a request is due at the end of the period it is sent in, periods
    /// counted from the client's start until a stream starts ([`Client::start_stream`]),
    /// then from the stream's.
    Reserved {
        /// When the first period began (shared by the client's clones).
        epoch: std::sync::Arc<std::sync::Mutex<std::time::Instant>>,
        /// The reservation's period, µs.
        period_us: u64,
    },
    /// Rebuild and scrub.
    Background,
}

impl ServiceClock {
    /// Reserved at `reservation`'s period from now, or best effort without one.
    pub(crate) fn of(reservation: Option<Reservation>) -> ServiceClock {
        match reservation {
            Some(reservation) => ServiceClock::Reserved {
                epoch: std::sync::Arc::new(std::sync::Mutex::new(std::time::Instant::now())),
                period_us: reservation.period_us.max(1),
            },
            None => ServiceClock::BestEffort,
        }
    }

    /// What a request sent now asks for.
    pub(crate) fn now(&self) -> Service {
        match self {
            ServiceClock::BestEffort => Service::BestEffort,
            ServiceClock::Background => Service::Background,
            ServiceClock::Reserved { epoch, period_us } => {
                let epoch = *epoch.lock().unwrap_or_else(|e| e.into_inner());
                let elapsed_us = u64::try_from(epoch.elapsed().as_micros()).unwrap_or(u64::MAX);
                let period_us = *period_us;
                Service::Reserved {
                    deadline_us: period_left_us(elapsed_us, period_us),
                }
            }
        }
    }

    /// A reserved stream starts its periods at `at`.
    fn restart(&self, at: std::time::Instant) {
        if let ServiceClock::Reserved { epoch, .. } = self {
            *epoch.lock().unwrap_or_else(|e| e.into_inner()) = at;
        }
    }
}

impl Client {
    /// A reserved stream of this client starts now: its clock (when chunks may go, which
    /// deadlines were met), and the periods of everything that serves it begin with it:
    /// the pacing of the client's datagram sessions and the deadlines its requests carry to
    /// the servers. (Counted from the client's start or its sessions' opening instead, they
    /// ran out of phase with the stream's, and a period's last bytes were paced past its
    /// deadline.)
    pub fn start_stream(&self, reservation: Reservation) -> StreamClock {
        let clock = StreamClock::start(reservation);
        let at = clock.start.into_std();
        self.service.restart(at);
        self.transport.start_periods(at);
        clock
    }
}

/// µs from `elapsed_us` into a stream to the end of the period it is in (a whole period at
/// a period's start).
pub(crate) fn period_left_us(elapsed_us: u64, period_us: u64) -> u64 {
    period_us - elapsed_us % period_us
}

/// A stream the manager admitted (its admission control, issue 18): renewed in the background
/// until released or dropped; a client that goes away stops renewing and its reservation
/// lapses at the end of its lease.
pub struct Admission {
    id: u64,
    client: Client,
    renewals: tokio::task::JoinHandle<()>,
}

impl Client {
    /// Asks the manager to admit a stream of `file` at `reservation`'s rate: it refuses at
    /// once ([`tessera_wire::ManagerError::ReservationRefused`], naming the link) if a link of
    /// the file's servers cannot carry it besides the streams already admitted.
    pub async fn admit_stream(
        &self,
        file: &File,
        reservation: Reservation,
    ) -> Result<Admission, ClientError> {
        let request = ManagerRequest::Reserve {
            file: file.id,
            rate_bytes_per_s: reservation.rate_bytes_per_s,
        };
        let (id, lease_ms) = match self.manager_call(request).await? {
            ManagerResponse::Reserved { id, lease_ms } => (id, lease_ms),
            other => return Err(self.unexpected("reserved", other)),
        };
        let (client, every) = (self.clone(), Duration::from_millis(lease_ms.max(3) / 3));
        let renewals = tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let renew = ManagerRequest::RenewReservation { id };
                if let Err(e) = client.manager_call(renew).await {
                    tracing::warn!("cannot renew reservation {id}: {e}");
                }
            }
        });
        Ok(Admission {
            id,
            client: self.clone(),
            renewals,
        })
    }
}

impl Admission {
    /// The reservation's id at the manager.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Gives the reservation back (the stream ended).
    pub async fn release(self) -> Result<(), ClientError> {
        self.renewals.abort();
        let release = ManagerRequest::ReleaseReservation { id: self.id };
        match self.client.manager_call(release).await? {
            ManagerResponse::Done => Ok(()),
            other => Err(self.client.unexpected("done", other)),
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.renewals.abort();
    }
}

/// What a reserved stream did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamReport {
    /// Bytes moved.
    pub bytes: u64,
    /// The reserved rate, bytes/s.
    pub rate_bytes_per_s: u64,
    /// The period, µs.
    pub period_us: u64,
    /// Periods the stream's bytes spanned (the last one possibly partial).
    pub periods: u64,
    /// Periods whose bytes were all done by their deadline.
    pub deadlines_met: u64,
    /// Periods whose bytes were done after their deadline.
    pub deadlines_missed: u64,
    /// How late the latest period was, µs (0 if none was late).
    pub worst_lateness_us: u64,
    /// From the start to the last byte, µs.
    pub elapsed_us: u64,
}

/// The bookkeeping of one reserved stream.
#[derive(Clone, Debug)]
pub struct StreamLedger {
    reservation: Reservation,
    /// Bytes done, in order from the stream's start.
    done_bytes: u64,
    /// Periods whose deadlines were judged (their bytes all done).
    judged_periods: u64,
    report: StreamReport,
}

impl StreamLedger {
    /// A ledger for a stream starting at time 0. The reservation must be valid.
    pub fn new(reservation: Reservation) -> StreamLedger {
        reservation
            .validate()
            .expect("reservations are validated where they are parsed");
        StreamLedger {
            reservation,
            done_bytes: 0,
            judged_periods: 0,
            report: StreamReport {
                rate_bytes_per_s: reservation.rate_bytes_per_s,
                period_us: reservation.period_us,
                ..StreamReport::default()
            },
        }
    }

    fn budget(&self) -> u64 {
        self.reservation.bytes_per_period()
    }

    /// Bytes due in each period.
    pub fn budget_bytes(&self) -> u64 {
        self.budget()
    }

    /// The earliest time, µs from the start, a chunk beginning `offset` bytes into the stream
    /// may start: the beginning of the period its first byte belongs to. A period's bytes are
    /// released together at its start, so that they can be done by its end (released at the
    /// rate instead, the last chunk of each period started just before the deadline and was
    /// late by its own transfer time: 0.42 s for a put at 5 MB/s here), and the stream never
    /// moves more than a period's budget ahead.
    pub fn release_at_us(&self, offset: u64) -> u64 {
        let period = offset / self.budget();
        period.saturating_mul(self.reservation.period_us)
    }

    /// How many bytes the chunk starting `offset` bytes into the stream, `file_offset` into
    /// the file, may carry: at most `chunk_bytes`, ending at a multiple of `chunk_bytes` in
    /// the file (whole stripes stay whole) and never past the end of the period its first
    /// byte belongs to. A chunk across a period's end was released with the earlier period
    /// but carried bytes of the later one, more than the sessions' budget for the period,
    /// and its completion (the earlier period's deadline) waited for the next period's
    /// budget (`lab radon`: deadlines missed by 5-50 ms at a rate of 0.985-1.003).
    pub fn chunk_bytes_at(&self, offset: u64, file_offset: u64, chunk_bytes: u64) -> u64 {
        let chunk_bytes = chunk_bytes.max(1);
        let budget = self.budget();
        let to_period_end = budget - offset % budget;
        let to_chunk_end = chunk_bytes - file_offset % chunk_bytes;
        to_period_end.min(to_chunk_end)
    }

    /// The next `bytes` of the stream were done at `now_us`: judges every period whose bytes
    /// they complete (met if done by the period's end).
    pub fn on_done(&mut self, bytes: u64, now_us: u64) {
        self.done_bytes += bytes;
        self.report.bytes = self.done_bytes;
        self.report.elapsed_us = now_us;
        let budget = self.budget();
        while (self.judged_periods + 1).saturating_mul(budget) <= self.done_bytes {
            self.judge(now_us);
        }
    }

    fn judge(&mut self, now_us: u64) {
        let deadline_us = (self.judged_periods + 1).saturating_mul(self.reservation.period_us);
        self.judged_periods += 1;
        self.report.periods += 1;
        if now_us <= deadline_us {
            self.report.deadlines_met += 1;
        } else {
            self.report.deadlines_missed += 1;
            let late = now_us - deadline_us;
            self.report.worst_lateness_us = self.report.worst_lateness_us.max(late);
        }
    }

    /// The stream ended with every byte done: the last, partial period is judged too, by
    /// when its last byte was done (its bytes were due by its end).
    pub fn finish(mut self) -> StreamReport {
        if self.done_bytes > self.judged_periods.saturating_mul(self.budget()) {
            let done_at = self.report.elapsed_us;
            self.judge(done_at);
        }
        self.report
    }
}

/// Why a rate or period given as text is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReservationParseError {
    /// Not a number followed by a known unit.
    #[error("bad rate '{0}' (expected e.g. 20MB/s, 500KiB/s, 160Mbit/s)")]
    Rate(String),
    /// The rate is zero, negative, or under one byte per second.
    #[error("rate '{0}' must be at least 1 byte/s")]
    RateNotPositive(String),
    /// Not a duration with a unit.
    #[error("bad period '{0}' (expected e.g. 1s, 500ms)")]
    Period(String),
    /// The period is shorter than Radon allows.
    #[error("period '{0}' must be at least 1ms")]
    PeriodTooShort(String),
}

fn split_number(text: &str) -> Option<(f64, String)> {
    let text = text.trim();
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
        .unwrap_or(text.len());
    let value: f64 = text[..end].parse().ok()?;
    value
        .is_finite()
        .then(|| (value, text[end..].trim().to_ascii_lowercase()))
}

/// Parses a rate: `20MB/s` (decimal units: B, KB, MB, GB), `20MiB/s` (binary), `160Mbit/s`,
/// or plain bytes per second.
pub fn parse_rate(text: &str) -> Result<u64, ReservationParseError> {
    let bad = || ReservationParseError::Rate(text.to_string());
    let (value, unit) = split_number(text).ok_or_else(bad)?;
    let unit = unit.strip_suffix("/s").unwrap_or(&unit);
    let scale: f64 = match unit {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "kbit" => 1e3 / 8.0,
        "mbit" => 1e6 / 8.0,
        "gbit" => 1e9 / 8.0,
        _ => return Err(bad()),
    };
    let rate = value * scale;
    if rate < 1.0 {
        return Err(ReservationParseError::RateNotPositive(text.to_string()));
    }
    if rate > u64::MAX as f64 / 2.0 {
        return Err(bad());
    }
    Ok(rate as u64)
}

/// Parses a period: `1s`, `500ms`, `2000us`.
pub fn parse_period_us(text: &str) -> Result<u64, ReservationParseError> {
    let bad = || ReservationParseError::Period(text.to_string());
    let (value, unit) = split_number(text).ok_or_else(bad)?;
    let scale = match unit.as_str() {
        "s" => 1e6,
        "ms" => 1e3,
        "us" | "µs" => 1.0,
        _ => return Err(bad()),
    };
    let us = value * scale;
    if us < tessera_datagram::radon::PERIOD_US_MIN as f64 {
        return Err(ReservationParseError::PeriodTooShort(text.to_string()));
    }
    if us > 1e15 {
        return Err(bad());
    }
    Ok(us as u64)
}

/// When the chunks of a reserved stream may start.
#[derive(Clone)]
pub struct Pacing {
    start: tokio::time::Instant,
    ledger: StreamLedger,
}

impl Pacing {
    /// See [`StreamLedger::chunk_bytes_at`].
    pub fn chunk_bytes_at(&self, offset: u64, file_offset: u64, chunk_bytes: u64) -> u64 {
        self.ledger.chunk_bytes_at(offset, file_offset, chunk_bytes)
    }

    /// When a chunk `offset` bytes into the stream may start.
    pub fn release(&self, offset: u64) -> tokio::time::Instant {
        self.start + Duration::from_micros(self.ledger.release_at_us(offset))
    }
}

/// A reserved stream's clock: when the loop may start a chunk, and its deadlines.
pub struct StreamClock {
    ledger: StreamLedger,
    start: tokio::time::Instant,
}

impl StreamClock {
    /// The stream starts now.
    pub fn start(reservation: Reservation) -> StreamClock {
        StreamClock {
            ledger: StreamLedger::new(reservation),
            start: tokio::time::Instant::now(),
        }
    }

    /// When chunks may start, as a value the chunks' futures can hold.
    pub fn pacing(&self) -> Pacing {
        Pacing {
            start: self.start,
            ledger: self.ledger.clone(),
        }
    }

    /// Bytes due in each period.
    pub fn budget_bytes(&self) -> u64 {
        self.ledger.budget_bytes()
    }

    /// See [`StreamLedger::chunk_bytes_at`].
    pub fn chunk_bytes_at(&self, offset: u64, file_offset: u64, chunk_bytes: u64) -> u64 {
        self.ledger.chunk_bytes_at(offset, file_offset, chunk_bytes)
    }

    /// Waits until a chunk `offset` bytes into the stream may start.
    pub async fn wait(&self, offset: u64) {
        tokio::time::sleep_until(self.pacing().release(offset)).await;
    }

    /// `bytes` more of the stream are done.
    pub fn done(&mut self, bytes: u64) {
        let now_us = u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.ledger.on_done(bytes, now_us);
    }

    /// The report, once every byte is done.
    pub fn finish(self) -> StreamReport {
        self.ledger.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(rate: u64, period_us: u64) -> StreamLedger {
        StreamLedger::new(Reservation {
            rate_bytes_per_s: rate,
            period_us,
        })
    }

    #[test]
    fn requests_are_due_at_the_end_of_their_period() {
        assert_eq!(period_left_us(0, 1_000_000), 1_000_000);
        assert_eq!(period_left_us(999_999, 1_000_000), 1);
        assert_eq!(period_left_us(1_000_000, 1_000_000), 1_000_000);
        assert_eq!(period_left_us(2_300_000, 1_000_000), 700_000);
        assert_eq!(period_left_us(u64::MAX, 1), 1);
        assert_eq!(ServiceClock::of(None).now(), Service::BestEffort);
        let reserved = ServiceClock::of(Some(Reservation {
            rate_bytes_per_s: 1_000,
            period_us: 60_000_000,
        }));
        let Service::Reserved { deadline_us } = reserved.now() else {
            panic!("a reserved client's requests are reserved");
        };
        assert!(deadline_us <= 60_000_000 && deadline_us > 50_000_000);
    }

    #[test]
    fn chunks_are_released_at_the_start_of_their_period() {
        // 500,000 bytes per period of 500 ms.
        let ledger = ledger(1_000_000, 500_000);
        assert_eq!(ledger.release_at_us(0), 0);
        assert_eq!(ledger.release_at_us(499_999), 0);
        assert_eq!(ledger.release_at_us(500_000), 500_000);
        assert_eq!(ledger.release_at_us(3_200_000), 3_000_000);
        assert_eq!(ledger.release_at_us(u64::MAX), u64::MAX / 500_000 * 500_000);
    }

    #[test]
    fn chunks_end_at_their_period_s_end_and_stay_on_the_file_s_chunk_grid() {
        // 1,000 bytes per period, chunks of 300 from the file's offset 600.
        let ledger = ledger(1_000_000, 1_000);
        let (mut offset, mut cuts) = (0, Vec::new());
        while offset < 2_500 {
            let len = ledger.chunk_bytes_at(offset, 600 + offset, 300);
            cuts.push(len);
            offset += len;
        }
        // Stream offsets 0, 300, 600, 900 | 1,000, 1,200, 1,500, 1,800 | 2,000, 2,100, ...
        assert_eq!(
            cuts,
            [300, 300, 300, 100, 200, 300, 300, 200, 100, 300, 300]
        );
        assert_eq!(cuts.iter().sum::<u64>(), 2_700);
        assert_eq!(
            ledger.chunk_bytes_at(5, 5, 0),
            1,
            "a chunk of at least a byte"
        );
    }

    #[test]
    fn periods_are_judged_by_when_their_last_byte_was_done() {
        // 1,000 bytes per period of 1 ms.
        let mut ledger = ledger(1_000_000, 1_000);
        ledger.on_done(600, 500);
        ledger.on_done(600, 900); // period 1 done at 900: met
        ledger.on_done(800, 2_300); // period 2 done at 2,300: 300 late
        ledger.on_done(500, 2_900); // 2,500 bytes: half of period 3, judged at the finish
        let report = ledger.finish();
        assert_eq!(
            report,
            StreamReport {
                bytes: 2_500,
                rate_bytes_per_s: 1_000_000,
                period_us: 1_000,
                periods: 3,
                deadlines_met: 2,
                deadlines_missed: 1,
                worst_lateness_us: 300,
                elapsed_us: 2_900,
            }
        );
    }

    #[test]
    fn rates_and_periods_parse_or_say_what_is_wrong() {
        assert_eq!(parse_rate("20MB/s"), Ok(20_000_000));
        assert_eq!(parse_rate("1.5MiB/s"), Ok(1_572_864));
        assert_eq!(parse_rate("160Mbit/s"), Ok(20_000_000));
        assert_eq!(parse_rate("4096"), Ok(4096));
        for zero in ["0", "0MB/s", "-5MB/s", "0.1"] {
            assert_eq!(
                parse_rate(zero),
                Err(ReservationParseError::RateNotPositive(zero.into()))
            );
        }
        for bad in ["", "fast", "20 parsecs/s", "MB/s", "nan", "inf"] {
            assert_eq!(
                parse_rate(bad),
                Err(ReservationParseError::Rate(bad.into()))
            );
        }
        assert_eq!(parse_period_us("1s"), Ok(1_000_000));
        assert_eq!(parse_period_us("250ms"), Ok(250_000));
        assert_eq!(
            parse_period_us("0s"),
            Err(ReservationParseError::PeriodTooShort("0s".into()))
        );
        assert_eq!(
            parse_period_us("1"),
            Err(ReservationParseError::Period("1".into()))
        );
    }
}
