//! `hung_up` tells a closed helper connection from a quiet or a busy one.
//! The daemon's watch on its helper rests on it: a hang-up that reads as
//! nothing leaves a dead helper unnoticed (the daemon never reports
//! itself degraded). No root needed.

use std::os::fd::AsFd;
use std::time::Duration;

use mcrelay_sockets::fdpass::{pair, send_with_fds};
use mcrelay_sockets::hung_up;

#[test]
fn a_closed_peer_is_a_hang_up() {
    let (a, b) = pair().expect("pair");
    drop(b);
    // Generous: the answer is immediate once the peer is gone.
    let hung = hung_up(a.as_fd(), Some(Duration::from_secs(60))).expect("poll");
    assert!(hung, "the peer closed: a hang-up");
}

#[test]
fn a_closed_peer_is_a_hang_up_even_with_data_left_unread() {
    let (a, b) = pair().expect("pair");
    send_with_fds(&b, b"last words", &[]).expect("send");
    drop(b);
    let hung = hung_up(a.as_fd(), Some(Duration::from_secs(60))).expect("poll");
    assert!(hung, "unread data must not hide the hang-up");
}

#[test]
fn pending_data_alone_is_not_a_hang_up() {
    let (a, b) = pair().expect("pair");
    send_with_fds(&b, b"request", &[]).expect("send");
    // The short timeout is the answer being waited for here (nothing is
    // going to happen): no hang-up within it.
    let hung = hung_up(a.as_fd(), Some(Duration::from_millis(50))).expect("poll");
    assert!(!hung, "data pending, peer still there");
    drop(b);
}
