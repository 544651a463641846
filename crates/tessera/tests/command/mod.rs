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
