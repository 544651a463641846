//! Settings of the machine itself that the lab holds for the length of a run: how long an
//! idle virtual CPU polls before it halts.
//!
//! Every host of the lab shares the machine's few CPUs, so one request and its answer cross
//! several process wakeups, and a wakeup on an idle CPU is the CPU's cost. On a virtual
//! machine an idle CPU halts, which exits to the hypervisor, and waking it again costs tens
//! of microseconds more than on a physical machine, varying with how busy the hypervisor's
//! host is. The kernel's `haltpoll` cpuidle governor hides this by polling for a while before
//! halting (`guest_halt_poll_ns`, 200 µs by default); some virtual machines boot with it at
//! zero. The lab sets it for the run and restores it afterwards, so that what is measured is
//! the transport and not the hypervisor's wakeup latency, and records it in the testbed.

use crate::LabError;
use std::path::{Path, PathBuf};

/// The `haltpoll` governor's setting: nanoseconds an idle CPU polls before it halts.
pub const HALT_POLL_NS_PATH: &str = "/sys/module/haltpoll/parameters/guest_halt_poll_ns";
/// The kernel's default for [`HALT_POLL_NS_PATH`], in microseconds.
pub const HALT_POLL_US_DEFAULT: u64 = 200;

/// The halt polling in force now, in microseconds; `None` on a machine without the
/// `haltpoll` governor (a physical machine, or a virtual one that does not use it).
pub fn halt_poll_us() -> Option<u64> {
    read_ns(Path::new(HALT_POLL_NS_PATH)).map(|ns| ns / 1000)
}

fn read_ns(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Halt polling set for a run; dropping it puts back what was there before.
#[derive(Debug)]
pub struct HaltPoll {
    path: PathBuf,
    before_ns: u64,
}

impl HaltPoll {
    /// Set halt polling to `us` microseconds. `Ok(None)` if this machine has no `haltpoll`
    /// governor, so there is nothing to set.
    pub fn set(us: u64) -> Result<Option<HaltPoll>, LabError> {
        HaltPoll::set_at(Path::new(HALT_POLL_NS_PATH), us)
    }

    fn set_at(path: &Path, us: u64) -> Result<Option<HaltPoll>, LabError> {
        let Some(before_ns) = read_ns(path) else {
            return Ok(None);
        };
        write_ns(path, us.saturating_mul(1000))?;
        Ok(Some(HaltPoll {
            path: path.to_path_buf(),
            before_ns,
        }))
    }

    /// What was set before, in microseconds.
    pub fn before_us(&self) -> u64 {
        self.before_ns / 1000
    }
}

fn write_ns(path: &Path, ns: u64) -> Result<(), LabError> {
    std::fs::write(path, ns.to_string()).map_err(LabError::io(format!("write {}", path.display())))
}

impl Drop for HaltPoll {
    fn drop(&mut self) {
        if let Err(e) = write_ns(&self.path, self.before_ns) {
            eprintln!("lab: cannot restore halt polling: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_for_the_run_and_restores_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("guest_halt_poll_ns");
        std::fs::write(&path, "0\n").unwrap();
        let guard = HaltPoll::set_at(&path, 200).unwrap().unwrap();
        assert_eq!(guard.before_us(), 0);
        assert_eq!(read_ns(&path), Some(200_000));
        drop(guard);
        assert_eq!(read_ns(&path), Some(0));
    }

    #[test]
    fn a_machine_without_the_governor_has_nothing_to_set() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing");
        assert!(HaltPoll::set_at(&path, 200).unwrap().is_none());
        assert!(!path.exists());
    }
}
