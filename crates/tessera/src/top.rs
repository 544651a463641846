//! `tessera top`: a live view of the cluster for people who do not run Grafana. Each
//! refresh asks the manager for the servers and their states and for what each owes, and
//! every up server for its counters (requests and payload bytes served, the datagram
//! transport's retransmissions, rebuild and scrub bytes, the disk's use); rates are the
//! differences between two refreshes.

use anyhow::Result;
use std::collections::{BTreeMap, HashMap};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};
use tessera_client::Client;
use tessera_wire::{ServerId, ServerStatus};

/// One server's line.
struct Row {
    status: ServerStatus,
    counters: Option<BTreeMap<String, u64>>,
    /// What it owes, if the manager said.
    owed: Option<Owed>,
}

/// What a server owes: whole files (it was down when they were made, or its store was
/// wiped), and stripes of other files.
struct Owed(tessera_manager::metrics::Owed);

impl Owed {
    fn of(debts: &[tessera_wire::FileDebt]) -> Owed {
        let mut owed = tessera_manager::metrics::Owed::default();
        for debt in debts {
            owed.add(&debt.missed);
        }
        Owed(owed)
    }

    fn describe(&self) -> String {
        let owed = &self.0;
        let mut parts = Vec::new();
        if owed.whole_files > 0 {
            parts.push(format!("all of {} files", owed.whole_files));
        }
        if owed.files > 0 {
            parts.push(format!("{} stripes of {} files", owed.stripes, owed.files));
        }
        if parts.is_empty() {
            "nothing".to_string()
        } else {
            parts.join(", ")
        }
    }
}

/// What a counter grew by per second since the last refresh (`None` on the first).
fn rate(now: &Row, before: Option<&Row>, name: &str, seconds: f64) -> Option<f64> {
    let now = *now.counters.as_ref()?.get(name)?;
    let before = *before?.counters.as_ref()?.get(name)?;
    Some(now.saturating_sub(before) as f64 / seconds)
}

async fn sample(client: &Client) -> Result<Vec<Row>> {
    let servers = client.status().await?;
    let counters: HashMap<ServerId, BTreeMap<String, u64>> = client
        .counters_of(servers.clone())
        .await
        .into_iter()
        .collect();
    let mut rows = Vec::new();
    for status in servers {
        let owed = client.debts_of(status.id).await.ok().map(|d| Owed::of(&d));
        rows.push(Row {
            counters: counters.get(&status.id).cloned(),
            status,
            owed,
        });
    }
    Ok(rows)
}

/// Bytes in a short human form (decimal units, as `df -H`).
fn human(bytes: u64) -> String {
    let units = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < units.len() {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", units[unit])
    }
}

/// The store's bytes and what is left free on its disk, e.g. `1.2 GB, 40.3 GB free`.
fn disk(row: &Row) -> String {
    let counters = row.counters.as_ref();
    let get = |name: &str| counters.and_then(|c| c.get(name)).copied();
    match (get("disk_stored_bytes"), get("disk_available_bytes")) {
        (Some(stored), Some(free)) => format!("{}, {} free", human(stored), human(free)),
        _ => "-".to_string(),
    }
}

fn render(rows: &[Row], before: &HashMap<ServerId, Row>, seconds: f64) -> String {
    let mut out = format!(
        "{:>4}  {:<22}  {:<6}  {:>9}  {:>9}  {:>9}  {:>8}  {:>9}  {:<22}  owes\n",
        "id", "address", "state", "req/s", "in MB/s", "out MB/s", "retx/s", "bg MB/s", "disk"
    );
    for row in rows {
        let prev = before.get(&row.status.id);
        let show =
            |v: Option<f64>, scale: f64| v.map_or("-".to_string(), |v| format!("{:.1}", v / scale));
        let owes = row.owed.as_ref().map_or("?".to_string(), Owed::describe);
        out += &format!(
            "{:>4}  {:<22}  {:<6}  {:>9}  {:>9}  {:>9}  {:>8}  {:>9}  {:<22}  {owes}\n",
            row.status.id,
            row.status.addr,
            row.status.state.name(),
            show(rate(row, prev, "requests_served", seconds), 1.0),
            show(rate(row, prev, "payload_bytes_received", seconds), 1e6),
            show(rate(row, prev, "payload_bytes_sent", seconds), 1e6),
            show(rate(row, prev, "retransmissions", seconds), 1.0),
            show(rate(row, prev, "background_bytes", seconds), 1e6),
            disk(row),
        );
    }
    out
}

/// Refreshes every `interval`; `count` refreshes, or until interrupted. On a terminal the
/// screen is redrawn in place; otherwise each refresh is printed after the last.
pub async fn run(client: Client, interval: Duration, count: Option<u64>) -> Result<()> {
    let redraw = std::io::stdout().is_terminal() && count.is_none();
    let mut before: HashMap<ServerId, Row> = HashMap::new();
    let mut taken = Instant::now();
    let mut refreshes = 0u64;
    loop {
        let rows = sample(&client).await?;
        let now = Instant::now();
        let seconds = now.duration_since(taken).as_secs_f64().max(1e-3);
        let text = render(&rows, &before, seconds);
        let mut stdout = std::io::stdout().lock();
        if redraw {
            // Clear the screen and go home (ANSI), then draw.
            write!(stdout, "\x1b[2J\x1b[H")?;
        } else if refreshes > 0 {
            writeln!(stdout)?;
        }
        write!(stdout, "{text}")?;
        stdout.flush()?;
        drop(stdout);
        refreshes += 1;
        if count.is_some_and(|c| refreshes >= c) {
            return Ok(());
        }
        before = rows.into_iter().map(|r| (r.status.id, r)).collect();
        taken = now;
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_layout::{Layout, Scheme};
    use tessera_wire::{FileDebt, FileMeta, IndexRange};

    fn debt(missed: &[(u64, u64)]) -> FileDebt {
        FileDebt {
            meta: FileMeta {
                id: 1,
                path: "f".into(),
                layout: Layout::new(Scheme::Raid5, 65536, 3).expect("layout"),
                servers: vec![1, 2, 3],
                size: 0,
            },
            missed: missed.iter().map(|&(a, b)| IndexRange::new(a, b)).collect(),
            tag: 1,
        }
    }

    #[test]
    fn what_a_server_owes_reads_as_whole_files_and_stripes() {
        assert_eq!(Owed::of(&[]).describe(), "nothing");
        let owed = Owed::of(&[
            debt(&[(0, 4), (10, 11)]),
            debt(&[(0, u64::MAX)]),
            debt(&[(7, 9)]),
        ]);
        assert_eq!(owed.describe(), "all of 1 files, 7 stripes of 2 files");
    }

    #[test]
    fn bytes_read_in_decimal_units() {
        assert_eq!(human(0), "0 B");
        assert_eq!(human(999), "999 B");
        assert_eq!(human(1_500), "1.5 kB");
        assert_eq!(human(40_300_000_000), "40.3 GB");
        assert_eq!(human(u64::MAX), "18.4 EB");
    }
}
