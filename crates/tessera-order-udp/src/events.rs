//! The node's events on their way from the driver's thread to the application's.
//!
//! The driver hands over every event one poll of the node produced as one batch: a channel
//! operation per event (two per message and node: its PO and its UTO delivery) cost more
//! CPU at 64-byte messages than the protocol's own work on them (the lab's 5-node closed
//! loops: ~13% of the machine in `mpmc` send and receive). A batch is the node's own event
//! queue ([`tessera_order::Node::take_events`]), and the application's side sends every
//! queue it has emptied back to the driver, which gives it to the node for the next
//! events: the same few buffers go round, warm in the caches, where a fresh batch of
//! ~16,000 events (1 MB) was memory for the kernel to fault in, and moving every event
//! into it missed the caches. [`Events`] hands the events out one at a time again, with
//! `std::sync::mpsc`'s receive methods and errors, or all that are ready at once
//! ([`Events::drain_ready`]).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::mpsc::{self, RecvError, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use tessera_order::Event;

/// A batch: the node's event queue as the driver took it.
pub(crate) type Batch = VecDeque<Event>;

/// The driver's side: batches go out, emptied queues come back.
pub(crate) struct EventSender {
    batches: mpsc::Sender<Batch>,
    spares: mpsc::Receiver<Batch>,
}

impl EventSender {
    /// Hands `batch` over (dropped if the application dropped its side: the node goes on
    /// regardless).
    pub(crate) fn send(&self, batch: Batch) {
        drop(self.batches.send(batch));
    }

    /// An emptied queue the application sent back, else a new one.
    pub(crate) fn spare(&self) -> Batch {
        self.spares.try_recv().unwrap_or_default()
    }
}

/// A new channel of batches of events.
pub(crate) fn channel() -> (EventSender, Events) {
    let (batches, batches_rx) = mpsc::channel();
    let (spares_tx, spares) = mpsc::channel();
    (
        EventSender { batches, spares },
        Events::new(batches_rx, spares_tx),
    )
}

/// The node's events, received from the driver in batches and handed out one by one in
/// the order the node produced them.
pub struct Events {
    batches: mpsc::Receiver<Batch>,
    /// Emptied batches, back to the driver.
    spares: mpsc::Sender<Batch>,
    /// The rest of the batch last received.
    ready: RefCell<Batch>,
}

impl Events {
    fn new(batches: mpsc::Receiver<Batch>, spares: mpsc::Sender<Batch>) -> Events {
        Events {
            batches,
            spares,
            ready: RefCell::new(VecDeque::new()),
        }
    }

    /// The next event, if one is ready now.
    pub fn try_recv(&self) -> Result<Event, TryRecvError> {
        self.next(|| self.batches.try_recv())
    }

    /// The next event, waiting for one as long as the driver runs.
    pub fn recv(&self) -> Result<Event, RecvError> {
        self.next(|| self.batches.recv())
    }

    /// The next event, waiting at most `timeout` for one.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Event, RecvTimeoutError> {
        let deadline = Instant::now() + timeout;
        self.next(|| {
            let left = deadline.saturating_duration_since(Instant::now());
            self.batches.recv_timeout(left)
        })
    }

    /// Calls `each` on every event ready now, in order (the rest of the batch last
    /// received, then every batch already sent), without waiting; how many. Cheaper than
    /// [`Events::try_recv`] per event when thousands come at once.
    pub fn drain_ready(&self, mut each: impl FnMut(Event)) -> usize {
        let mut count = 0;
        loop {
            let mut ready = self.ready.borrow_mut();
            count += ready.len();
            ready.drain(..).for_each(&mut each);
            drop(ready);
            match self.batches.try_recv() {
                Ok(batch) => self.replace_ready(batch),
                Err(_) => return count,
            }
        }
    }

    /// The next event ready, else the first of the next non-empty batch `receive` gives.
    fn next<E>(&self, mut receive: impl FnMut() -> Result<Batch, E>) -> Result<Event, E> {
        if let Some(event) = self.ready.borrow_mut().pop_front() {
            return Ok(event);
        }
        loop {
            self.replace_ready(receive()?);
            if let Some(event) = self.ready.borrow_mut().pop_front() {
                return Ok(event);
            }
        }
    }

    /// Takes `batch` as the events ready (those before must all be handed out); the
    /// emptied queue goes back to the driver.
    fn replace_ready(&self, batch: Batch) {
        let emptied = self.ready.replace(batch);
        debug_assert!(emptied.is_empty(), "events handed out in order");
        if emptied.capacity() > 0 {
            // The driver may be gone: then the queue is only freed.
            drop(self.spares.send(emptied));
        }
    }
}

/// An empty stream, its driver gone: what [`crate::Handle::events`] holds after
/// [`crate::Handle::take_events`].
impl Default for Events {
    fn default() -> Events {
        Events::new(mpsc::channel().1, mpsc::channel().0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn suspect(position: u64) -> Event {
        Event::Joined { position }
    }

    fn node_of(event: Event) -> u64 {
        match event {
            Event::Joined { position } => position,
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn batches_come_out_one_by_one_in_order() {
        let (sender, events) = channel();
        sender.send(VecDeque::from([suspect(1), suspect(2)]));
        sender.send(VecDeque::new());
        sender.send(VecDeque::from([suspect(3)]));
        assert_eq!(node_of(events.try_recv().unwrap()), 1);
        assert_eq!(node_of(events.recv().unwrap()), 2);
        assert_eq!(
            node_of(events.recv_timeout(Duration::from_millis(10)).unwrap()),
            3
        );
        assert_eq!(events.try_recv().unwrap_err(), TryRecvError::Empty);
        assert_eq!(
            events.recv_timeout(Duration::from_millis(1)).unwrap_err(),
            RecvTimeoutError::Timeout
        );
        drop(sender);
        assert_eq!(events.try_recv().unwrap_err(), TryRecvError::Disconnected);
        assert!(events.recv().is_err());
    }

    #[test]
    fn what_is_ready_is_handed_out_after_the_driver_stops() {
        let (sender, events) = channel();
        sender.send(VecDeque::from([suspect(4), suspect(5)]));
        drop(sender);
        assert_eq!(node_of(events.recv().unwrap()), 4);
        assert_eq!(node_of(events.recv().unwrap()), 5);
        assert_eq!(events.try_recv().unwrap_err(), TryRecvError::Disconnected);
        assert!(Events::default().recv().is_err());
    }

    /// `drain_ready` hands out the rest of a batch and every batch already sent, in order,
    /// without waiting; each emptied queue goes back to the driver as a spare, with its
    /// memory.
    #[test]
    fn drain_ready_takes_every_batch_sent_and_returns_the_queues() {
        let (sender, events) = channel();
        sender.send(VecDeque::from([suspect(1), suspect(2)]));
        sender.send(VecDeque::from([suspect(3)]));
        sender.send(VecDeque::from([suspect(4), suspect(5)]));
        assert_eq!(node_of(events.recv().unwrap()), 1);
        let mut seen = Vec::new();
        assert_eq!(events.drain_ready(|event| seen.push(node_of(event))), 4);
        assert_eq!(seen, [2, 3, 4, 5]);
        assert_eq!(events.drain_ready(|_| panic!("nothing is ready")), 0);
        // The first two queues were emptied and replaced: both came back.
        for _ in 0..2 {
            let spare = sender.spare();
            assert!(spare.is_empty() && spare.capacity() > 0);
        }
        assert_eq!(
            sender.spare().capacity(),
            0,
            "a new queue once none is back"
        );
    }
}
