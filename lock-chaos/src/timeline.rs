//! The timeline of a run as an SVG: a row per client with the time it believed it held the
//! lock, fault windows shaded (a client's on its row, a server's across every row), writes
//! the register turned away and lost signals marked. Drawn with plotters.

use std::collections::BTreeMap;

use plotters::prelude::*;

use crate::history::{Event, EventKind, Outcome};
use crate::schedule::{Fault, FaultKind};

/// Size of the plot, in pixels.
const SIZE: (u32, u32) = (1200, 480);
/// Room above the top row, in rows, where the legend goes so that it hides no belief.
const HEADROOM: f64 = 2.2;
/// The font of every text.
const FONT: &str = "sans-serif";

/// The shade of a fault window.
fn shade(kind: FaultKind) -> RGBAColor {
    let colour = match kind {
        FaultKind::ServerPause => RGBColor(0xe6, 0x9f, 0x00),
        FaultKind::ServerKill => RGBColor(0xd5, 0x5e, 0x00),
        FaultKind::LeaderKill => RGBColor(0xcc, 0x79, 0xa7),
        FaultKind::ClientFreeze => RGBColor(0x56, 0xb4, 0xe9),
        FaultKind::ClientKill => RGBColor(0x99, 0x99, 0x99),
        FaultKind::Partition => RGBColor(0x00, 0x9e, 0x73),
        FaultKind::MemberPartition => RGBColor(0x00, 0x72, 0xb2),
        FaultKind::Failover => RGBColor(0xf0, 0xe4, 0x42),
    };
    colour.mix(0.25)
}

/// What the timeline shows.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Timeline<'a> {
    /// The title above the plot.
    pub title: &'a str,
    /// Every client's events.
    pub events: &'a [Event],
    /// The beliefs, as the checker computes them: `(client, start_ns, end_ns)`.
    pub beliefs: &'a [(u32, u64, u64)],
    /// The faults as injected.
    pub faults: &'a [Fault],
    /// When the run began and ended, on the events' clock.
    pub began_ns: u64,
    /// See [`began_ns`](Self::began_ns).
    pub ended_ns: u64,
    /// How many clients there were.
    pub clients: u32,
}

impl Timeline<'_> {
    /// The SVG.
    ///
    /// # Errors
    ///
    /// When plotters cannot draw it (it draws into a string: in practice never).
    pub fn svg(&self) -> Result<String, String> {
        let mut svg = String::new();
        self.draw(&mut svg).map_err(|error| error.to_string())?;
        Ok(svg)
    }

    fn seconds(&self, ns: u64) -> f64 {
        ns.saturating_sub(self.began_ns) as f64 / 1e9
    }

    fn draw(&self, svg: &mut String) -> Result<(), DrawingAreaErrorKind<std::io::Error>> {
        let root = SVGBackend::with_string(svg, SIZE).into_drawing_area();
        root.fill(&WHITE)?;
        let end = self.seconds(self.ended_ns).max(1.0);
        let rows = f64::from(self.clients.max(1));
        let mut chart = ChartBuilder::on(&root)
            .caption(self.title, (FONT, 18).into_font())
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..end, -0.5..rows - 0.5 + HEADROOM)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .x_desc("seconds into the run")
            .y_labels(self.clients as usize + 3)
            .y_label_formatter(&|row| {
                if *row >= 0.0 && *row < rows - 0.25 {
                    format!("client {}", row.round())
                } else {
                    String::new()
                }
            })
            .label_style((FONT, 13))
            .draw()?;

        // Only the kinds the run injected, so that the legend stays above the rows.
        let injected = FaultKind::ALL
            .into_iter()
            .filter(|&kind| self.faults.iter().any(|fault| fault.kind == kind));
        for kind in injected {
            let windows = self
                .faults
                .iter()
                .filter(|fault| fault.kind == kind)
                .map(|fault| {
                    let (from, to) = (fault.start_ms as f64 / 1e3, fault.end_ms() as f64 / 1e3);
                    let (low, high) = if kind.targets_client() {
                        let row = f64::from(fault.target);
                        (row - 0.5, row + 0.5)
                    } else {
                        (-0.5, rows - 0.5)
                    };
                    Rectangle::new([(from, low), (to, high)], shade(kind).filled())
                });
            chart
                .draw_series(windows)?
                .label(kind.as_str())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 12, y + 5)], shade(kind).filled())
                });
        }

        // Pieces closer than a pixel are drawn as one.
        let pixel = end / f64::from(SIZE.0);
        let mut merged: BTreeMap<u32, Vec<(f64, f64)>> = BTreeMap::new();
        let mut beliefs = self.beliefs.to_vec();
        beliefs.sort_unstable_by_key(|&(client, start, _)| (client, start));
        for (client, start, end) in beliefs {
            let (start, end) = (self.seconds(start), self.seconds(end));
            let row = merged.entry(client).or_default();
            match row.last_mut() {
                Some(last) if start - last.1 < pixel => last.1 = last.1.max(end),
                _ => row.push((start, end)),
            }
        }
        let held = RGBColor(0x00, 0x72, 0xb2);
        chart
            .draw_series(merged.iter().flat_map(|(&client, pieces)| {
                let row = f64::from(client);
                pieces.iter().map(move |&(start, end)| {
                    Rectangle::new(
                        [(start, row - 0.3), (end.max(start + pixel), row + 0.3)],
                        held.filled(),
                    )
                })
            }))?
            .label("believes it holds the lock")
            .legend(move |(x, y)| Rectangle::new([(x, y - 4), (x + 12, y + 4)], held.filled()));

        let marks = |kind: EventKind, outcome: Outcome| {
            self.events
                .iter()
                .filter(move |event| event.kind == kind && event.outcome == outcome)
                .map(|event| (self.seconds(event.end_ns), f64::from(event.client)))
        };
        chart
            .draw_series(
                marks(EventKind::Write, Outcome::Rejected)
                    .map(|at| Cross::new(at, 5, RED.stroke_width(2))),
            )?
            .label("write turned away (stale token)")
            .legend(|(x, y)| Cross::new((x + 6, y), 5, RED.stroke_width(2)));
        chart
            .draw_series(
                marks(EventKind::Lost, Outcome::Ok)
                    .map(|at| TriangleMarker::new(at, 6, BLACK.filled())),
            )?
            .label("lost signal")
            .legend(|(x, y)| TriangleMarker::new((x + 6, y), 6, BLACK.filled()));

        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font((FONT, 12))
            .draw()?;
        root.present()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeline_shows_beliefs_faults_and_marks() {
        let s = 1_000_000_000;
        let events = [
            Event::new(1, EventKind::Write, 2 * s, 2 * s, Outcome::Rejected).with_token(1),
            Event::new(1, EventKind::Lost, 3 * s, 3 * s, Outcome::Ok).with_token(1),
        ];
        let faults = [Fault {
            start_ms: 1_000,
            duration_ms: 1_500,
            kind: FaultKind::ClientFreeze,
            target: 1,
        }];
        let svg = Timeline {
            title: "test",
            events: &events,
            beliefs: &[(0, 0, s), (1, s / 2, 3 * s)],
            faults: &faults,
            began_ns: 0,
            ended_ns: 4 * s,
            clients: 2,
        }
        .svg()
        .unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..40.min(svg.len())]);
        for text in [
            "client-freeze",
            "believes it holds the lock",
            "lost signal",
            "client 1",
        ] {
            assert!(svg.contains(text), "no {text:?} in the timeline");
        }
    }
}
