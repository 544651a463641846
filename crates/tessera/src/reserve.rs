//! `--rate` and `--period` on get, put, read and write: a reserved stream (Radon, issue 18),
//! its admission by the manager, its pacing in the transfer loops and its report; and the
//! manager's `--link-rate` and `--reservable-share`, what it admits against.

use anyhow::{bail, Context, Result};
use clap::Args;
use tessera_client::stream::{parse_period_us, parse_rate, Admission, Reservation, StreamReport};
use tessera_client::{Client, File};
use tessera_manager::reservations::LinkCapacity;

/// The reservation flags of a transfer.
#[derive(Args, Clone, Debug, Default)]
pub struct ReserveArgs {
    /// Reserve this rate for the transfer, e.g. 20MB/s, 16MiB/s, 160Mbit/s: each period's
    /// bytes are released at its start and, over UDP, every session to a server is paced at it.
    #[arg(long)]
    pub rate: Option<String>,
    /// The reservation's period: each period's bytes are due by its end.
    #[arg(long, default_value = "1s", requires = "rate")]
    pub period: String,
    /// Print the stream's report as JSON.
    #[arg(long, requires = "rate")]
    pub json: bool,
}

impl ReserveArgs {
    /// The reservation asked for, if any; a bad rate or period is a one-line error.
    pub fn reservation(&self) -> Result<Option<Reservation>> {
        let Some(rate) = &self.rate else {
            return Ok(None);
        };
        let reservation = Reservation {
            rate_bytes_per_s: parse_rate(rate)?,
            period_us: parse_period_us(&self.period)?,
        };
        reservation.validate()?;
        Ok(Some(reservation))
    }
}

/// The manager's admission control: what reserved streams may take of each server's link
/// and of each client host's.
#[derive(Args, Clone, Debug, Default)]
pub struct LinkArgs {
    /// Every host's link rate, storage servers' and clients', e.g. 1Gbit/s or 100MB/s:
    /// reserved streams are admitted only while they fit in --reservable-share of it on
    /// every server they use and on their client's host
    /// [default: none, every reservation is admitted]
    #[arg(long, env = "TESSERA_LINK_RATE")]
    pub link_rate: Option<String>,
    /// The share of each link reservations may take, above 0 and at most 1 [default: 0.9]
    #[arg(long, env = "TESSERA_RESERVABLE_SHARE", requires = "link_rate")]
    pub reservable_share: Option<f64>,
}

impl LinkArgs {
    /// The capacity the flags configure; a bad rate or share is a one-line error.
    pub fn capacity(&self) -> Result<LinkCapacity> {
        let mut capacity = LinkCapacity::default();
        if let Some(rate) = &self.link_rate {
            capacity.link_bytes_per_s = Some(parse_rate(rate).context("--link-rate")?);
        }
        if let Some(share) = self.reservable_share {
            if !(share > 0.0 && share <= 1.0) {
                bail!("--reservable-share must be above 0 and at most 1, not {share}");
            }
            capacity.reservable_share_millis = ((share * 1_000.0).round() as u64).max(1);
        }
        Ok(capacity)
    }
}

/// Asks the manager to admit a reserved stream of `file` (`None` without a reservation).
pub async fn admit(
    client: &Client,
    file: &File,
    reservation: Option<Reservation>,
) -> Result<Option<Admission>> {
    let Some(reservation) = reservation else {
        return Ok(None);
    };
    Ok(Some(client.admit_stream(file, reservation).await?))
}

/// Gives a stream's reservation back; a failure only delays its release to the lease's end.
pub async fn release(admission: Option<Admission>) {
    if let Some(admission) = admission {
        let id = admission.id();
        if let Err(e) = admission.release().await {
            tracing::warn!("reservation {id} not released (its lease will end it): {e}");
        }
    }
}

/// One line for people, or JSON; on stderr when the data itself goes to stdout.
pub fn print_report(report: &StreamReport, json: bool, data_on_stdout: bool) {
    let line = if json {
        serde_json::to_string(report).expect("a report serializes")
    } else {
        let seconds = report.elapsed_us as f64 / 1e6;
        format!(
            "stream: {} bytes in {:.3} s ({:.2} MB/s, reserved {:.2} MB/s per {} ms): {} periods, {} deadlines met, {} missed, worst lateness {:.1} ms",
            report.bytes,
            seconds,
            report.bytes as f64 / seconds.max(1e-6) / 1e6,
            report.rate_bytes_per_s as f64 / 1e6,
            report.period_us / 1_000,
            report.periods,
            report.deadlines_met,
            report.deadlines_missed,
            report.worst_lateness_us as f64 / 1e3,
        )
    };
    if data_on_stdout {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
}
