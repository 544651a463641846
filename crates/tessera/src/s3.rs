//! `tessera s3`: the S3 gateway over the cluster that every client command finds.

use crate::commands::{self, parse_size};
use crate::config::Config;
use anyhow::{anyhow, bail, Context, Result};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use tessera_client::{LayoutRequest, Scheme};
use tessera_s3::metrics::GatewayMetrics;
use tessera_s3::{Gateway, Keys};

/// What `tessera s3` was given.
pub struct S3Args {
    /// Address to listen on.
    pub listen: String,
    /// Access key, if given.
    pub access_key: Option<String>,
    /// Secret key, if given.
    pub secret_key: Option<String>,
    /// Default scheme of new buckets.
    pub scheme: String,
    /// Default stripe unit of new buckets.
    pub stripe_unit: String,
    /// Default width of new buckets.
    pub width: Option<u32>,
    /// Write the bound address here once listening.
    pub addr_file: Option<PathBuf>,
    /// Serve Prometheus metrics here.
    pub metrics: Option<String>,
    /// `--idle-timeout`, e.g. `20s`.
    pub idle_timeout: String,
}

pub async fn run(config: &Config, args: S3Args) -> Result<()> {
    let listen: SocketAddr = args
        .listen
        .parse()
        .map_err(|_| anyhow!("bad listen address '{}'", args.listen))?;
    let defaults = LayoutRequest {
        scheme: args.scheme.parse::<Scheme>()?,
        stripe_unit: parse_size(&args.stripe_unit)?,
        width: args.width,
    };
    let (keys, generated) = match (args.access_key, args.secret_key) {
        (Some(access), Some(secret)) if !access.is_empty() && !secret.is_empty() => {
            (Keys { access, secret }, false)
        }
        (None, None) => (Keys::generate(), true),
        _ => bail!(
            "give both --access-key and --secret-key (non-empty), or neither to generate a pair"
        ),
    };
    let client = commands::connect_checked(config).await?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let addr = listener.local_addr()?;
    commands::write_addr_file(args.addr_file, addr)?;
    println!("S3 endpoint: http://{addr}");
    println!("access key:  {}", keys.access);
    if generated {
        // Printed only when made here: a key given on the command line is the caller's.
        println!("secret key:  {}", keys.secret);
    }
    let idle_us = tessera_client::stream::parse_period_us(&args.idle_timeout).map_err(|_| {
        anyhow!(
            "bad idle timeout '{}' (expected e.g. 20s, 500ms)",
            args.idle_timeout
        )
    })?;
    let gateway =
        Gateway::new(client, defaults).with_idle_timeout(std::time::Duration::from_micros(idle_us));
    let metrics = args
        .metrics
        .as_ref()
        .map(|_| Arc::new(GatewayMetrics::default()));
    let counted = metrics.clone();
    let _scrape = crate::metrics_http::serve_if(args.metrics.as_deref(), move || {
        let text = counted.as_ref().map(|m| m.text()).unwrap_or_default();
        async move { text }
    })
    .await?;
    tokio::select! {
        served = tessera_s3::serve(listener, gateway, keys, metrics) => {
            served.context("S3 gateway stopped")
        }
        () = commands::until_terminated() => Ok(()),
    }
}
