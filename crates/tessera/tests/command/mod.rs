//! Running the `tessera` binary from the multi-process tests, never against the cluster
//! `TESSERA_CLUSTER` names (a test starts its own).

// Each test crate uses a part of it.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output, Stdio};

/// Runs `tessera ARGS` to its end, with no input.
pub fn tessera(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .env_remove("TESSERA_CLUSTER")
        .stdin(Stdio::null())
        .output()
        .expect("cannot start the tessera binary")
}

/// A temporary path as an argument.
pub fn text(path: &Path) -> &str {
    path.to_str().expect("temporary paths are UTF-8")
}

/// A memory figure of process `pid` from `/proc/PID/status` (`VmRSS`: resident now,
/// `VmHWM`: the most ever resident), in bytes.
pub fn process_memory_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("process status");
    let line = status
        .lines()
        .find(|l| {
            l.strip_prefix(field)
                .is_some_and(|rest| rest.starts_with(':'))
        })
        .unwrap_or_else(|| panic!("no {field} in the status of process {pid}"));
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{field} in kB: '{line}'"));
    kib << 10
}
