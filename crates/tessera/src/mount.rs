//! `tessera mount` and `tessera umount`: the cluster as a POSIX file system (FUSE).
//!
//! `mount` starts itself again as a detached process (`--foreground`), which serves the
//! mount until it is unmounted, and returns once the mount is in place; its log goes to a
//! file whose path it prints. `umount` asks `fusermount3` to unmount, which ends that
//! process.

use crate::commands::{self, parse_size};
use crate::config::Config;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tessera_client::{LayoutRequest, Scheme};
use tessera_fuse::{MountConfig, TesseraFs};

/// How long `mount` waits for the serving process to have the mount in place.
const MOUNT_WAIT: Duration = Duration::from_secs(20);
/// Threads that serve the kernel's requests.
const SERVE_THREADS: usize = 4;

/// What `tessera mount` was given.
pub struct MountArgs {
    /// Where to mount.
    pub mountpoint: PathBuf,
    /// Serve from this process instead of a detached one.
    pub foreground: bool,
    /// Scheme of files created through the mount.
    pub scheme: String,
    /// Their stripe unit.
    pub stripe_unit: String,
    /// Their width.
    pub width: Option<u32>,
}

/// Whether `mountpoint` is a Tessera FUSE mount now (per /proc/self/mountinfo).
fn is_mounted(mountpoint: &Path) -> bool {
    let Ok(canonical) = mountpoint.canonicalize() else {
        return false;
    };
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    table.lines().any(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        // After the separator: the file system type, then the source.
        let mut after = line.split(" - ").nth(1).unwrap_or("").split(' ');
        let (fstype, source) = (after.next().unwrap_or(""), after.next().unwrap_or(""));
        fields.get(4).map(Path::new) == Some(canonical.as_path())
            && fstype.starts_with("fuse")
            && source == "tessera"
    })
}

fn check_mountpoint(mountpoint: &Path) -> Result<()> {
    let meta = std::fs::metadata(mountpoint)
        .with_context(|| format!("mount point {}", mountpoint.display()))?;
    if !meta.is_dir() {
        bail!("mount point {} is not a directory", mountpoint.display());
    }
    if is_mounted(mountpoint) {
        bail!("{} is already a Tessera mount", mountpoint.display());
    }
    Ok(())
}

pub async fn run(config: &Config, args: MountArgs) -> Result<()> {
    check_mountpoint(&args.mountpoint)?;
    let layout = LayoutRequest {
        scheme: args.scheme.parse::<Scheme>()?,
        stripe_unit: parse_size(&args.stripe_unit)?,
        width: args.width,
    };
    // Connect first, in both modes: a wrong cluster fails here, with its own error.
    let client = commands::connect_checked(config).await?;
    if !args.foreground {
        return spawn_detached(config.cluster.clone(), &args).await;
    }
    let fs = TesseraFs::new(
        client,
        tokio::runtime::Handle::current(),
        MountConfig { layout },
    );
    let mountpoint = args.mountpoint.clone();
    let serving =
        tokio::task::spawn_blocking(move || tessera_fuse::serve(fs, &mountpoint, SERVE_THREADS));
    tokio::select! {
        served = serving => served?.with_context(|| format!("mount {}", args.mountpoint.display())),
        () = commands::until_terminated() => {
            // Unmounting ends the session; the kernel forgets the mount either way.
            unmount(&args.mountpoint)
        }
    }
}

/// Starts `tessera mount --foreground` detached and waits for its mount.
async fn spawn_detached(cluster: Option<String>, args: &MountArgs) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let log = std::env::temp_dir().join(format!(
        "tessera-mount-{}.log",
        args.mountpoint
            .canonicalize()?
            .to_string_lossy()
            .trim_matches('/')
            .replace('/', "-")
    ));
    let out = std::fs::File::create(&log).with_context(|| format!("log {}", log.display()))?;
    let mut command = std::process::Command::new(std::env::current_exe()?);
    command
        .args(std::env::args_os().skip(1))
        .arg("--foreground");
    if let Some(cluster) = cluster {
        command.env("TESSERA_CLUSTER", cluster);
    }
    command
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .process_group(0);
    let mut child = command.spawn().context("start the mount process")?;
    let began = Instant::now();
    while began.elapsed() < MOUNT_WAIT {
        if is_mounted(&args.mountpoint) {
            println!(
                "mounted {} (pid {}, log {})",
                args.mountpoint.display(),
                child.id(),
                log.display()
            );
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let last = text.lines().last().unwrap_or("no output");
            bail!("the mount process ended ({status}): {last}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    bail!(
        "the mount did not appear within {} s (log {})",
        MOUNT_WAIT.as_secs(),
        log.display()
    )
}

/// `tessera umount MOUNTPOINT`.
pub fn unmount(mountpoint: &Path) -> Result<()> {
    if !is_mounted(mountpoint) {
        bail!("{} is not a Tessera mount", mountpoint.display());
    }
    let output = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg(mountpoint)
        .output()
        .context("run fusermount3 (Debian package fuse3)")?;
    if !output.status.success() {
        bail!(
            "fusermount3 -u {}: {}",
            mountpoint.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}
