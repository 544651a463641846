//! Where the CLI finds its keys: the cluster secret (daemons, and the admin's commands) and a
//! client access key (client commands), from the command line, else the local cluster's files.

use crate::config::Config;
use anyhow::{anyhow, bail, Context, Result};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use tessera_client::{Claim, Credential, Secret};

/// File name of the cluster secret in a local cluster's directory (and the manager's default).
pub const SECRET_FILE_NAME: &str = "cluster.secret";

/// Reads a cluster secret file.
pub fn read_secret(path: &Path) -> Result<Secret> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the cluster secret {}", path.display()))?;
    Secret::from_file_text(&text).with_context(|| format!("{}", path.display()))
}

/// Creates a new random cluster secret at `path`, readable by its owner only; refuses to
/// replace an existing one (every server and key of the cluster depends on it).
pub fn create_secret(path: &Path) -> Result<Secret> {
    let secret = Secret::from_bytes(rand::random());
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create the cluster secret {}", path.display()))?;
    file.write_all(secret.to_file_text().as_bytes())?;
    file.sync_all()?;
    Ok(secret)
}

/// The secret at `path`, created first if it does not exist yet.
pub fn read_or_create_secret(path: &Path) -> Result<Secret> {
    if path.exists() {
        read_secret(path)
    } else {
        create_secret(path)
    }
}

/// The admin's credential: from `--secret`, else the local cluster's secret file.
pub fn admin(config: &Config, cluster_secret: Option<&Path>) -> Result<Credential> {
    let path = (config.secret.clone())
        .or_else(|| cluster_secret.map(Path::to_path_buf))
        .ok_or_else(|| {
            anyhow!("this command needs the admin's credential: pass --secret FILE (the cluster secret)")
        })?;
    Ok(Credential {
        claim: Claim::Admin,
        key: read_secret(&path)?.admin_key(),
    })
}

/// A client's credential: `--key`, else the local cluster's access key, else the admin's
/// (`--secret`, for operators and the lab).
pub fn client(
    config: &Config,
    cluster_key: Option<&str>,
    cluster_secret: Option<&Path>,
) -> Result<Credential> {
    if let Some(text) = config.key.as_deref().or(cluster_key) {
        return tessera_client::parse_access_key(text).map_err(|e| anyhow!("{e}"));
    }
    if config.secret.is_some() {
        return admin(config, cluster_secret);
    }
    bail!("no access key: pass --key KEYID:SECRET (from `tessera key create`), or use a local cluster's cluster.toml")
}
