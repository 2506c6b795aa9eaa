//! Progress on long operations (building and vendoring a release, admitting one), drawn on
//! stderr only when it is a terminal: logs, pipes and scripts see the command's own lines
//! and nothing else.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A spinner showing `msg` and the time taken, cleared when dropped.
pub struct Spinner(ProgressBar);

impl Spinner {
    /// Starts the spinner (hidden unless stderr is a terminal).
    pub fn start(msg: impl Into<String>) -> Spinner {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
            bar.set_style(style);
        }
        bar.set_message(msg.into());
        bar.enable_steady_tick(Duration::from_millis(120));
        Spinner(bar)
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}
