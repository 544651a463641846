//! The node's events on their way from the driver's thread to the application's.
//!
//! The driver hands over every event one poll of the node produced as one batch: a channel
//! operation per event (two per message and node: its PO and its UTO delivery) cost more
//! CPU at 64-byte messages than the protocol's own work on them (the lab's 5-node closed
//! loops: ~13% of the machine in `mpmc` send and receive). [`Events`] hands them out one
//! at a time again, with `std::sync::mpsc`'s receive methods and errors.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::mpsc::{self, RecvError, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use tessera_order::Event;

/// The sending side: the driver's batches.
pub(crate) type EventSender = mpsc::Sender<Vec<Event>>;

/// A new channel of batches of events.
pub(crate) fn channel() -> (EventSender, Events) {
    let (sender, receiver) = mpsc::channel();
    (sender, Events::new(receiver))
}

/// The node's events, received from the driver in batches and handed out one by one in
/// the order the node produced them.
pub struct Events {
    batches: mpsc::Receiver<Vec<Event>>,
    /// The rest of the batch last received.
    ready: RefCell<VecDeque<Event>>,
}

impl Events {
    fn new(batches: mpsc::Receiver<Vec<Event>>) -> Events {
        Events {
            batches,
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

    /// The next event ready, else the first of the next non-empty batch `receive` gives.
    fn next<E>(&self, mut receive: impl FnMut() -> Result<Vec<Event>, E>) -> Result<Event, E> {
        if let Some(event) = self.ready.borrow_mut().pop_front() {
            return Ok(event);
        }
        loop {
            if let Some(event) = self.take(receive()?) {
                return Ok(event);
            }
        }
    }

    /// Keeps all but the first of `batch` for later; the first.
    fn take(&self, batch: Vec<Event>) -> Option<Event> {
        let mut batch = VecDeque::from(batch);
        let first = batch.pop_front();
        if first.is_some() {
            *self.ready.borrow_mut() = batch;
        }
        first
    }
}

/// An empty stream, its driver gone: what [`crate::Handle::events`] holds after
/// [`crate::Handle::take_events`].
impl Default for Events {
    fn default() -> Events {
        Events::new(mpsc::channel().1)
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
        sender.send(vec![suspect(1), suspect(2)]).unwrap();
        sender.send(Vec::new()).unwrap();
        sender.send(vec![suspect(3)]).unwrap();
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
        sender.send(vec![suspect(4), suspect(5)]).unwrap();
        drop(sender);
        assert_eq!(node_of(events.recv().unwrap()), 4);
        assert_eq!(node_of(events.recv().unwrap()), 5);
        assert_eq!(events.try_recv().unwrap_err(), TryRecvError::Disconnected);
        assert!(Events::default().recv().is_err());
    }
}
