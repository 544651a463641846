//! `--metrics ADDR`: the Prometheus scrape endpoint of a daemon (`GET /metrics`, text format
//! 0.0.4), served with hyper.

use anyhow::{anyhow, Context, Result};
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::net::SocketAddr;

/// A scrape endpoint being served; it stops when dropped.
pub struct Endpoint(tokio::task::JoinHandle<()>);

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// [`serve`] on `addr` if a daemon was given `--metrics ADDR`; the endpoint stops when the
/// value is dropped.
pub async fn serve_if<F, Fut>(addr: Option<&str>, render: F) -> Result<Option<Endpoint>>
where
    F: Fn() -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = String> + Send + 'static,
{
    match addr {
        Some(addr) => Ok(Some(Endpoint(serve(addr, render).await?))),
        None => Ok(None),
    }
}

/// Listen on `addr` and answer every `GET /metrics` with what `render` gives, until the task
/// is dropped. Other paths get 404.
pub async fn serve<F, Fut>(addr: &str, render: F) -> Result<tokio::task::JoinHandle<()>>
where
    F: Fn() -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = String> + Send + 'static,
{
    let addr: SocketAddr = addr
        .parse()
        .map_err(|_| anyhow!("bad metrics address '{addr}'"))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen for metrics on {addr}"))?;
    eprintln!("metrics on http://{}/metrics", listener.local_addr()?);
    Ok(tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            };
            let render = render.clone();
            let service = hyper::service::service_fn(move |request: http::Request<_>| {
                let render = render.clone();
                async move {
                    let response = if request.uri().path() == "/metrics" {
                        http::Response::builder()
                            .header(
                                http::header::CONTENT_TYPE,
                                "text/plain; version=0.0.4; charset=utf-8",
                            )
                            .body(render().await)
                    } else {
                        http::Response::builder()
                            .status(http::StatusCode::NOT_FOUND)
                            .body("only /metrics is served here\n".to_string())
                    };
                    response
                }
            });
            tokio::spawn(async move {
                let connection = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service);
                // Scrapers that stay silent are dropped after a while.
                let _ = tokio::time::timeout(std::time::Duration::from_secs(60), connection).await;
            });
        }
    }))
}
