//! An application run on the driver's own thread ([`spawn_inline`]): the node's events go
//! to it by a call, and it proposes into the node by a call, with no channel, no second
//! thread and no wake-up between the two.
//!
//! With [`spawn`](crate::spawn) every delivery crosses a channel to the application's
//! thread and every proposal crosses one back (and an eventfd when the driver sleeps): on
//! a machine with fewer CPUs than busy threads each crossing is a wake-up of a sleeping
//! thread, tens of microseconds, paid per message. An inline application pays none of it;
//! in exchange it must not block (the node's datagrams and timers wait while it runs).

use crate::{DriverConfig, DriverError, DriverStats, Loss};
use bytes::Bytes;
use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use tessera_order::{Event, GroupChange, Micros, Node, NodeId, ProposeError, Role, Stats};

/// An application the driver calls on its thread. Neither call may block.
pub trait Application: Send + 'static {
    /// Called on every turn of the driver's loop, before it sends what the node has and
    /// sleeps: propose here. The answer is the longest the driver may sleep before the next
    /// turn (`None`: until a datagram arrives or the node's timer is due, at most
    /// [`POLL_US_MAX`](crate::POLL_US_MAX)).
    fn turn(&mut self, node: &mut Control<'_>) -> Option<Duration>;

    /// One of the node's events (deliveries, views, suspicions), as it happens.
    fn event(&mut self, event: Event, node: &mut Control<'_>);

    /// How long the driver polls its socket without sleeping before each wait (asked once,
    /// at the start). Zero, the default, sleeps at once: spinning answers a datagram
    /// without a wake-up, but takes the CPU from every other thread meanwhile.
    fn spin(&self) -> Duration {
        Duration::ZERO
    }
}

/// What an [`Application`] may do with its node during a call.
pub struct Control<'a> {
    pub(crate) node: &'a mut Node,
    pub(crate) now: Micros,
}

impl Control<'_> {
    /// Broadcasts `message` in total order ([`Node::propose`]: refused while the node's
    /// send queue is full; propose again on a later turn).
    pub fn propose(&mut self, message: Bytes) -> Result<(), ProposeError> {
        self.node.propose(message, self.now)
    }

    /// Broadcasts a group change ([`Node::propose_group_change`]).
    pub fn propose_group_change(
        &mut self,
        node: NodeId,
        role: Role,
    ) -> Result<GroupChange, ProposeError> {
        self.node.propose_group_change(node, role, self.now)
    }

    /// Own messages not yet acknowledged by every receiver ([`Node::unacked`]).
    pub fn unacked(&self) -> usize {
        self.node.unacked()
    }
}

/// A node whose application runs on its driver's thread.
pub struct InlineHandle<A> {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<InlineResult<A>>,
}

type InlineResult<A> = Result<(Stats, DriverStats, A), DriverError>;

impl<A> InlineHandle<A> {
    /// Stops the thread; what the node and the driver counted, and the application.
    pub fn stop(self) -> InlineResult<A> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().map_err(|_| DriverError::Stopped)?
    }

    /// Whether the driver's thread ended (an error, or a panic in the application).
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }
}

/// As [`spawn_split_lossy`](crate::spawn_split_lossy), with `app` called on the driver's
/// thread instead of channels to the caller's ([`Application`]). It stops within
/// [`POLL_US_MAX`](crate::POLL_US_MAX) of [`InlineHandle::stop`].
pub fn spawn_inline<A: Application>(
    driver: DriverConfig,
    send: UdpSocket,
    receive: UdpSocket,
    loss: Loss,
    mut app: A,
) -> Result<InlineHandle<A>, DriverError> {
    let mut runner = crate::Runner::start(driver, send, receive, loss)?;
    runner.spin_us = app.spin().as_micros() as u64;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let name = format!("order-{}", runner.node.id().0);
    let thread = std::thread::Builder::new().name(name).spawn(move || {
        crate::set_timer_slack();
        let (stats, driver) = runner.run(&flag, Some(&mut app))?;
        Ok((stats, driver, app))
    })?;
    Ok(InlineHandle { stop, thread })
}
