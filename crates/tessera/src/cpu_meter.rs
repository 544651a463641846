//! CPU time by group of processes, for the benchmarks: counted per process from
//! `/proc/PID/stat`, so other work on the machine does not show in it (it moves the
//! throughput, not the CPU a byte costs).

use anyhow::{bail, Context, Result};

/// CPU seconds (user and system, all threads) process `pid` has used so far.
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("cannot read the CPU time of process {pid}"))?;
    // The command name (in parentheses) may hold spaces: count fields after it, where
    // utime and stime are the 12th and 13th (fields 14 and 15 of proc(5)).
    let rest = stat.rfind(')').map_or("", |at| &stat[at + 1..]);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    let (Some(user), Some(system)) = (ticks(11), ticks(12)) else {
        bail!("malformed /proc/{pid}/stat");
    };
    // SAFETY: sysconf only reads a system constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok((user + system) as f64 / hz)
}

/// The CPU time of a few groups of processes (this one, a cluster's daemons, a peer).
pub struct CpuMeter {
    groups: Vec<Vec<u32>>,
}

/// CPU seconds so far of each of a [`CpuMeter`]'s groups, in its order.
#[derive(Clone)]
pub struct CpuSnapshot(Vec<f64>);

impl CpuMeter {
    /// A meter of `groups`, each a set of process ids (an empty group counts nothing).
    pub fn new(groups: Vec<Vec<u32>>) -> CpuMeter {
        CpuMeter { groups }
    }

    pub fn snapshot(&self) -> Result<CpuSnapshot> {
        let mut spent = Vec::with_capacity(self.groups.len());
        for group in &self.groups {
            let mut seconds = 0.0;
            for &pid in group {
                seconds += cpu_seconds(pid)?;
            }
            spent.push(seconds);
        }
        Ok(CpuSnapshot(spent))
    }

    /// CPU seconds per GiB of `bytes` each group spent since `before`.
    pub fn per_gib_since(&self, before: &CpuSnapshot, bytes: u64) -> Result<Vec<f64>> {
        let after = self.snapshot()?;
        let gib = bytes as f64 / f64::from(1u32 << 30);
        Ok(after
            .0
            .iter()
            .zip(&before.0)
            .map(|(a, b)| (a - b) / gib)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Busy until this process has spent `seconds` more CPU.
    fn spin(seconds: f64) {
        let start = cpu_seconds(std::process::id()).unwrap();
        let mut x = 0u64;
        while cpu_seconds(std::process::id()).unwrap() - start < seconds {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
            }
        }
    }

    /// A group of this process counts the CPU it spends, per GiB of the bytes given; an
    /// empty group counts nothing.
    #[test]
    fn the_meter_counts_cpu_per_gib_by_group() {
        let meter = CpuMeter::new(vec![vec![std::process::id()], vec![]]);
        let before = meter.snapshot().unwrap();
        spin(0.2);
        let spent = meter.per_gib_since(&before, 1 << 29).unwrap();
        assert_eq!(spent.len(), 2);
        assert!(spent[0] >= 0.4, "0.2 s of CPU over half a GiB: {spent:?}");
        assert_eq!(spent[1], 0.0);
    }

    /// A process that does not exist is an error naming it, not zero.
    #[test]
    fn a_missing_process_is_an_error() {
        let e = cpu_seconds(u32::MAX).unwrap_err().to_string();
        assert!(e.contains(&u32::MAX.to_string()), "{e}");
    }
}
