//! `mcrelayctl top`: the live view.
//!
//! On a terminal it is a ratatui screen ([`view`]) over a pure state
//! ([`model`]); this file is the thin loop between them: one thread asks
//! the daemon for a snapshot every interval, one reads the terminal's
//! events, one waits for SIGTERM/SIGHUP/SIGINT, and all three feed one
//! bounded channel that the drawing loop reads. The terminal is restored
//! however the view ends: a quit key, an error (the [`Screen`] guard's
//! drop), a signal, or a panic (a panic hook).
//!
//! Piped (stdout not a terminal) or with `--plain`, it prints the text
//! frame of `render_top` every interval instead.

mod history;
mod model;
mod view;

use std::io::{BufWriter, IsTerminal, Stdout, Write};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::time::Duration;

use crossterm::event::{self, Event as TermEvent, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use crossterm::execute;
use crossterm::terminal::{self, EnterAlternateScreen, LeaveAlternateScreen};
use mcrelay_control::{Rates, Snapshot, render_top};
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;

use model::{Key, Model};

/// How `top` runs.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Time between snapshots.
    pub interval: Duration,
    /// Stop after this many refreshes.
    pub iterations: Option<u64>,
    /// Print text frames even on a terminal.
    pub plain: bool,
}

/// What went wrong with the terminal (the daemon's errors are shown in the
/// view, or returned by the first request).
#[derive(Debug, thiserror::Error)]
pub enum TopError {
    #[error("setting up the terminal (raw mode, alternate screen)")]
    Setup(#[source] std::io::Error),
    #[error("drawing on the terminal")]
    Draw(#[source] std::io::Error),
    #[error("reading the terminal's keys")]
    Input(#[source] std::io::Error),
    #[error("watching for SIGTERM, SIGHUP and SIGINT")]
    Signals(#[source] std::io::Error),
    #[error("writing to stdout")]
    Print(#[source] std::io::Error),
}

/// Run the view until it is quit or has shown `iterations` refreshes.
/// `fetch` asks the daemon for a snapshot; if the first request fails the
/// error is returned before the terminal is touched.
pub fn run<F>(options: Options, mut fetch: F) -> anyhow::Result<()>
where
    F: FnMut() -> anyhow::Result<Snapshot> + Send + 'static,
{
    let first = fetch()?;
    if options.plain || !std::io::stdout().is_terminal() {
        return plain(options, first, fetch);
    }
    live(options, first, fetch)?;
    Ok(())
}

/// The text frames, one per interval, each below the last.
fn plain<F>(options: Options, first: Snapshot, mut fetch: F) -> anyhow::Result<()>
where
    F: FnMut() -> anyhow::Result<Snapshot>,
{
    let mut previous = first;
    let mut shown = 0u64;
    loop {
        std::thread::sleep(options.interval);
        let current = fetch()?;
        let rates = Rates::between(&previous, &current);
        let mut out = std::io::stdout().lock();
        write!(out, "{}", render_top(&current, &rates))
            .and_then(|()| out.flush())
            .map_err(TopError::Print)?;
        previous = current;
        shown += 1;
        if options.iterations.is_some_and(|n| shown >= n) {
            return Ok(());
        }
    }
}

/// What the drawing loop waits for.
#[derive(Debug)]
enum Event {
    Terminal(TermEvent),
    TerminalError(std::io::Error),
    /// A snapshot, or why there is none this time.
    Snapshot(Result<Snapshot, String>),
    /// SIGTERM, SIGHUP or SIGINT.
    Signal,
}

fn live<F>(options: Options, first: Snapshot, mut fetch: F) -> Result<(), TopError>
where
    F: FnMut() -> anyhow::Result<Snapshot> + Send + 'static,
{
    let mut model = Model::new(options.interval);
    model.update(first);
    // Room for a burst of keys; the senders wait while it is full.
    let (tx, rx) = sync_channel(64);
    watch_signals(tx.clone())?;
    let mut screen = Screen::enter()?;
    let interval = options.interval;
    let fetcher = tx.clone();
    // Neither thread is joined: each ends when the channel closes, and
    // quitting must not wait for a daemon that doesn't answer.
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(interval);
            let next = fetch().map_err(|e| format!("{e:#}"));
            if fetcher.send(Event::Snapshot(next)).is_err() {
                return;
            }
        }
    });
    std::thread::spawn(move || read_terminal(&tx));
    event_loop(&mut screen.terminal, &mut model, &rx, options.iterations)
}

fn event_loop(
    terminal: &mut Term,
    model: &mut Model,
    events: &Receiver<Event>,
    iterations: Option<u64>,
) -> Result<(), TopError> {
    let mut refreshes = 0u64;
    loop {
        // Resizes need nothing more: `draw` fits the new size.
        terminal
            .draw(|frame| view::draw(frame, model))
            .map_err(TopError::Draw)?;
        if model.quit() || iterations.is_some_and(|n| refreshes >= n) {
            return Ok(());
        }
        match events.recv() {
            Ok(Event::Terminal(TermEvent::Key(k))) => {
                if let Some(key) = key_of(k) {
                    model.key(key);
                }
            }
            Ok(Event::Terminal(_)) => {}
            Ok(Event::TerminalError(e)) => return Err(TopError::Input(e)),
            Ok(Event::Snapshot(Ok(s))) => {
                model.update(s);
                refreshes += 1;
            }
            Ok(Event::Snapshot(Err(e))) => {
                model.set_error(e);
                refreshes += 1;
            }
            // Every sender gone cannot happen while the loop holds none,
            // but it would mean nothing more can arrive.
            Ok(Event::Signal) | Err(_) => return Ok(()),
        }
    }
}

fn read_terminal(tx: &SyncSender<Event>) {
    loop {
        let event = match event::read() {
            Ok(e) => Event::Terminal(e),
            Err(e) => {
                let _ = tx.send(Event::TerminalError(e));
                return;
            }
        };
        if tx.send(event).is_err() {
            return;
        }
    }
}

/// Forward SIGTERM, SIGHUP and SIGINT to the loop, which then restores
/// the terminal and returns.
fn watch_signals(tx: SyncSender<Event>) -> Result<(), TopError> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGHUP, SIGINT])
        .map_err(TopError::Signals)?;
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            let _ = tx.send(Event::Signal);
        }
    });
    Ok(())
}

/// The model's name for a key press (releases and unknown keys: none).
fn key_of(k: KeyEvent) -> Option<Key> {
    if k.kind == KeyEventKind::Release {
        return None;
    }
    Some(match k.code {
        KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => Key::Interrupt,
        KeyCode::Char(c) => Key::Char(c),
        KeyCode::Up => Key::Up,
        KeyCode::Down => Key::Down,
        KeyCode::PageUp => Key::PageUp,
        KeyCode::PageDown => Key::PageDown,
        KeyCode::Home => Key::Home,
        KeyCode::End => Key::End,
        KeyCode::Enter => Key::Enter,
        KeyCode::Esc => Key::Esc,
        KeyCode::Backspace => Key::Backspace,
        _ => return None,
    })
}

/// The terminal the view draws on: each frame is buffered and written in
/// one piece (a frame written in small pieces flickers over a slow link).
type Term = Terminal<CrosstermBackend<BufWriter<Stdout>>>;

/// Bytes buffered per frame: a full 160×48 frame with its styles fits.
const FRAME_BUFFER: usize = 1 << 16;

/// The terminal in raw mode on the alternate screen, restored on drop,
/// and by a panic hook on a panic.
struct Screen {
    terminal: Term,
}

impl Screen {
    fn enter() -> Result<Self, TopError> {
        restore_on_panic();
        let entered = terminal::enable_raw_mode()
            .and_then(|()| execute!(std::io::stdout(), EnterAlternateScreen))
            .and_then(|()| {
                Terminal::new(CrosstermBackend::new(BufWriter::with_capacity(
                    FRAME_BUFFER,
                    std::io::stdout(),
                )))
            });
        match entered {
            Ok(terminal) => Ok(Self { terminal }),
            Err(e) => {
                // Undo whatever part of the set-up happened.
                restore();
                Err(TopError::Setup(e))
            }
        }
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = self.terminal.backend_mut().flush();
        restore();
    }
}

/// Cooked mode and the main screen again (best effort: this runs on the
/// way out, where an error has nowhere better to go).
fn restore() {
    let _ = terminal::disable_raw_mode();
    let _ = execute!(std::io::stdout(), LeaveAlternateScreen);
}

/// Restore the terminal before the panic message is printed (the default
/// hook's message would otherwise land on the alternate screen, in raw
/// mode, and vanish).
fn restore_on_panic() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info);
        }));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_keys_map_to_the_models() {
        let press = |code, modifiers| KeyEvent::new(code, modifiers);
        assert_eq!(
            key_of(press(KeyCode::Char('c'), KeyModifiers::CONTROL)),
            Some(Key::Interrupt)
        );
        assert_eq!(
            key_of(press(KeyCode::Char('c'), KeyModifiers::NONE)),
            Some(Key::Char('c'))
        );
        assert_eq!(
            key_of(press(KeyCode::PageDown, KeyModifiers::NONE)),
            Some(Key::PageDown)
        );
        assert_eq!(key_of(press(KeyCode::F(1), KeyModifiers::NONE)), None);
        let mut release = press(KeyCode::Char('q'), KeyModifiers::NONE);
        release.kind = KeyEventKind::Release;
        assert_eq!(key_of(release), None);
    }
}
