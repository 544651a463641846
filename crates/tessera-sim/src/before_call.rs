//! A client transport for tests that steps in before each call: the simulator's tests count,
//! hold back or race storage requests through it instead of each writing a transport.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use tessera_transport::{BoxFuture, Reply, Transport, TransportError};
use tessera_wire::{StorageCall, StorageRequest};

/// Runs `hook` with each call's server and storage request (`None` for a message that is not
/// one) and waits for the future it returns before the call goes to `inner`.
pub struct BeforeCall<F> {
    inner: Arc<dyn Transport>,
    hook: F,
}

impl<F> BeforeCall<F>
where
    F: Fn(SocketAddr, Option<&StorageRequest>) -> BoxFuture<'static, ()> + Send + Sync + 'static,
{
    /// `inner` with `hook` run before each call.
    pub fn new(inner: Arc<dyn Transport>, hook: F) -> BeforeCall<F> {
        BeforeCall { inner, hook }
    }
}

impl<F> Transport for BeforeCall<F>
where
    F: Fn(SocketAddr, Option<&StorageRequest>) -> BoxFuture<'static, ()> + Send + Sync + 'static,
{
    fn call(
        &self,
        addr: SocketAddr,
        message: Bytes,
        payload: Bytes,
    ) -> BoxFuture<'static, Result<Reply, TransportError>> {
        let call = tessera_wire::decode_message::<StorageCall>(&message).ok();
        let before = (self.hook)(addr, call.as_ref().map(|call| &call.request));
        let inner = self.inner.clone();
        Box::pin(async move {
            before.await;
            inner.call(addr, message, payload).await
        })
    }
}
