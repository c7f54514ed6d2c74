//! Reports of the herd scenario: aligned tables for the terminal, SVG line plots drawn
//! by hand, and a markdown summary whose findings are computed from the measurements.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::measure::{Measurement, ScaleMeasurement};
use crate::strategy::Strategy;

/// What a table shows where a figure was not counted.
const NONE: &str = "–";

/// The names of the strategies `keep` selects, in [`Strategy::ALL`]'s order.
fn strategies(keep: fn(Strategy) -> bool) -> Vec<&'static str> {
    Strategy::ALL
        .into_iter()
        .filter(|s| keep(*s))
        .map(Strategy::as_str)
        .collect()
}

/// Columns of [`table`] and of the markdown results table: header and whether the column
/// is aligned left (text) rather than right (numbers).
const MEASUREMENT_COLUMNS: [(&str, bool); 16] = [
    ("strategy", true),
    ("N", false),
    ("handoffs", false),
    ("hold µs", false),
    ("throughput/s", false),
    ("p50 µs", false),
    ("p99 µs", false),
    ("floor µs", false),
    ("p50/floor", false),
    ("physical µs", false),
    ("p50/physical", false),
    ("wake-ups/handoff", false),
    ("futile/handoff", false),
    ("server req/handoff", false),
    ("grants min–max", false),
    ("FIFO violations", false),
];

/// Columns of [`scale_table`].
const SCALE_COLUMNS: [(&str, bool); 7] = [
    ("strategy", true),
    ("locks", false),
    ("acquire/s", false),
    ("release/s", false),
    ("RSS B/lock", false),
    ("first round", false),
    ("leftovers", false),
];

/// An aligned plain-text table of `measurements` for the terminal: a header, a rule and
/// one row per measurement, in the order given.
///
/// Columns: strategy, N, handoffs, hold µs (measured), throughput/s, p50 µs, p99 µs,
/// floor µs, p50/floor, physical µs, p50/physical, wake-ups/handoff, futile/handoff,
/// server req/handoff, grants min–max and FIFO violations. Figures the client did not count show as `–`.
pub fn table(measurements: &[Measurement]) -> String {
    let rows: Vec<Vec<String>> = measurements.iter().map(measurement_cells).collect();
    aligned(&MEASUREMENT_COLUMNS, &rows)
}

/// An aligned plain-text table of scale runs for the terminal: a header, a rule and one
/// row per run (strategy, locks held, acquisitions and releases per second, client memory
/// growth per lock, and locks left on the server).
pub fn scale_table(measurements: &[ScaleMeasurement]) -> String {
    let rows: Vec<Vec<String>> = measurements.iter().map(scale_cells).collect();
    aligned(&SCALE_COLUMNS, &rows)
}

fn measurement_cells(m: &Measurement) -> Vec<String> {
    vec![
        m.strategy.clone(),
        m.contenders.to_string(),
        m.handoffs.to_string(),
        fixed(m.hold_p50_us, 0),
        fixed(m.throughput_per_s, 1),
        fixed(m.handoff_p50_us, 1),
        fixed(m.handoff_p99_us, 1),
        fixed(m.floor_p50_us, 1),
        fixed(m.handoff_to_floor, 2),
        fixed(m.physical_floor_p50_us, 1),
        fixed(m.handoff_to_physical_floor, 2),
        optional(m.wakeups_per_handoff, 2),
        optional(m.futile_wakeups_per_handoff, 2),
        optional(m.server_requests_per_handoff, 2),
        format!("{}–{}", m.min_grants, m.max_grants),
        m.fifo_violations.to_string(),
    ]
}

fn scale_cells(m: &ScaleMeasurement) -> Vec<String> {
    vec![
        m.strategy.clone(),
        m.locks.to_string(),
        fixed(m.acquire_per_s, 1),
        fixed(m.release_per_s, 1),
        fixed(m.rss_bytes_per_lock, 1),
        fixed(m.rss_bytes_per_lock_first_round, 1),
        m.leftovers.to_string(),
    ]
}

/// `value` with `decimals` digits after the point; non-finite values as Rust prints them.
fn fixed(value: f64, decimals: usize) -> String {
    if value.is_finite() {
        format!("{value:.decimals$}")
    } else {
        format!("{value}")
    }
}

fn optional(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| NONE.to_owned(), |v| fixed(v, decimals))
}

/// About three significant digits: `1.00`, `98.7`, `4567`.
fn short(value: f64) -> String {
    let magnitude = value.abs();
    if !value.is_finite() {
        format!("{value}")
    } else if magnitude >= 100.0 {
        format!("{value:.0}")
    } else if magnitude >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

/// Width of `text` in terminal columns, counting each character as one.
fn width(text: &str) -> usize {
    text.chars().count()
}

fn pad(text: &str, to: usize, left: bool) -> String {
    let fill = " ".repeat(to.saturating_sub(width(text)));
    if left {
        format!("{text}{fill}")
    } else {
        format!("{fill}{text}")
    }
}

fn aligned(columns: &[(&str, bool)], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = columns.iter().map(|(header, _)| width(header)).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(width(cell));
        }
    }
    let line = |cells: Vec<String>| -> String {
        let joined = cells
            .iter()
            .zip(columns.iter().zip(&widths))
            .map(|(cell, ((_, left), w))| pad(cell, *w, *left))
            .collect::<Vec<_>>()
            .join("  ");
        format!("{}\n", joined.trim_end())
    };
    let mut out = line(columns.iter().map(|(h, _)| (*h).to_owned()).collect());
    out.push_str(&line(widths.iter().map(|w| "-".repeat(*w)).collect()));
    for row in rows {
        out.push_str(&line(row.clone()));
    }
    out
}

fn markdown_cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

fn markdown_table(columns: &[(&str, bool)], rows: &[Vec<String>]) -> String {
    let header: Vec<String> = columns.iter().map(|(h, _)| markdown_cell(h)).collect();
    let rule: Vec<&str> = columns
        .iter()
        .map(|(_, left)| if *left { ":---" } else { "---:" })
        .collect();
    let mut out = format!("| {} |\n|{}|\n", header.join(" | "), rule.join("|"));
    for row in rows {
        let cells: Vec<String> = row.iter().map(|c| markdown_cell(c)).collect();
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    out
}

/// `text` with the characters XML gives a meaning escaped.
fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            _ => out.push(c),
        }
    }
    out
}

const SVG_WIDTH: f64 = 760.0;
const SVG_HEIGHT: f64 = 460.0;
const PLOT_LEFT: f64 = 80.0;
const PLOT_RIGHT: f64 = SVG_WIDTH - 200.0;
const PLOT_TOP: f64 = 50.0;
const PLOT_BOTTOM: f64 = SVG_HEIGHT - 60.0;

/// Colours for series without a colour of their own (Okabe–Ito and a few more).
const PALETTE: [&str; 10] = [
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#7F7F7F",
    "#8C564B", "#B8A800",
];

/// The colour of a series: the known strategies keep theirs across plots (herd ones warm,
/// herd-free ones cool); others take one from the palette by position.
fn colour(name: &str, index: usize) -> &'static str {
    match name {
        "zk-single" => "#D55E00",
        "zk-children" => "#E69F00",
        "zk-predecessor" => "#0072B2",
        "zk-recipe" => "#56B4E9",
        "redis-polling" => "#7F7F7F",
        "redis-pubsub" => "#CC79A7",
        "redis-queue" => "#009E73",
        _ => PALETTE
            .get(index % PALETTE.len())
            .copied()
            .unwrap_or("#000000"),
    }
}

/// A number for a coordinate attribute.
fn coord(value: f64) -> String {
    format!("{value:.1}")
}

/// A tick label: short, without trailing zeros.
fn tick_label(value: f64) -> String {
    let magnitude = value.abs();
    if value == 0.0 {
        "0".to_owned()
    } else if !(1e-3..1e6).contains(&magnitude) {
        format!("{value:e}")
    } else {
        let text = format!("{value:.4}");
        let text = text.trim_end_matches('0').trim_end_matches('.');
        if text == "-0" {
            "0".to_owned()
        } else {
            text.to_owned()
        }
    }
}

/// The value below which a log axis clamps: a tenth of the smallest positive value, or 0.1
/// when none is positive.
fn log_floor(values: impl Iterator<Item = f64>) -> f64 {
    values
        .filter(|v| *v > 0.0 && v.is_finite())
        .reduce(f64::min)
        .map_or(0.1, |smallest| smallest / 10.0)
}

/// Ticks of the 1-2-5 sequence within `[lo, hi]` (both positive); decades only when that
/// would give too many.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let first = lo.log10().floor();
    let last = hi.log10().ceil();
    if !(first.is_finite() && last.is_finite()) || last - first > 300.0 {
        return Vec::new();
    }
    let decades = (last - first).max(0.0) as i32;
    let in_range = |v: &f64| *v >= lo * (1.0 - 1e-9) && *v <= hi * (1.0 + 1e-9);
    let all: Vec<f64> = (0..=decades)
        .flat_map(|d| {
            let base = 10f64.powf(first + f64::from(d));
            [base, 2.0 * base, 5.0 * base]
        })
        .filter(in_range)
        .collect();
    if all.len() <= 12 {
        return all;
    }
    let step = (decades / 8 + 1).max(1);
    (0..=decades)
        .filter(|d| d % step == 0)
        .map(|d| 10f64.powf(first + f64::from(d)))
        .filter(in_range)
        .collect()
}

/// A step of 1, 2 or 5 times a power of ten near `raw`.
fn nice_step(raw: f64) -> f64 {
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let power = 10f64.powf(raw.log10().floor());
    let fraction = raw / power;
    let nice = if fraction <= 1.0 {
        1.0
    } else if fraction <= 2.0 {
        2.0
    } else if fraction <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * power
}

/// One axis: its range in plotting units (log10 of the value on a log axis) and its ticks
/// as values.
struct Axis {
    log: bool,
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
}

impl Axis {
    /// Where `value` falls along the axis, from 0 at `lo` to 1 at `hi`.
    fn fraction(&self, value: f64) -> f64 {
        let v = if self.log { value.log10() } else { value };
        let span = self.hi - self.lo;
        if span > 0.0 && span.is_finite() {
            (v - self.lo) / span
        } else {
            0.5
        }
    }

    /// A log axis over the positive values `lo..=hi`, padded a little each side.
    fn log_x(lo: f64, hi: f64) -> Axis {
        let (lo, hi) = if hi / lo < 1.0001 {
            (lo / 2.0, hi * 2.0)
        } else {
            (lo, hi)
        };
        let (l, h) = (lo.log10(), hi.log10());
        let padding = (h - l) * 0.06;
        let (l, h) = (l - padding, h + padding);
        let ticks = log_ticks(10f64.powf(l), 10f64.powf(h));
        Axis {
            log: true,
            lo: l,
            hi: h,
            ticks,
        }
    }

    /// A log axis over the positive values `lo..=hi`, widened to whole decades.
    fn log_y(lo: f64, hi: f64) -> Axis {
        let l = lo.log10().floor();
        let mut h = hi.log10().ceil();
        if h <= l {
            h = l + 1.0;
        }
        let ticks = log_ticks(10f64.powf(l), 10f64.powf(h));
        Axis {
            log: true,
            lo: l,
            hi: h,
            ticks,
        }
    }

    /// A linear axis from zero (or below, for negative values) to past `hi`, in round
    /// steps.
    fn linear_y(lo: f64, hi: f64) -> Axis {
        let lo = lo.min(0.0);
        let hi = if hi > lo { hi } else { lo + 1.0 };
        let step = nice_step((hi - lo) / 5.0);
        let start = (lo / step).floor() * step;
        let mut end = (hi / step).ceil() * step;
        if end <= start {
            end = start + step;
        }
        let ticks = (0..=50)
            .map(|i| start + f64::from(i) * step)
            .take_while(|t| *t <= end + step * 1e-9)
            .collect();
        Axis {
            log: false,
            lo: start,
            hi: end,
            ticks,
        }
    }
}

/// A self-contained SVG line plot of `series` (name and `(contenders, value)` points)
/// against the number of contenders, written without a plotting library.
///
/// The x axis is logarithmic with ticks at 1, 2, 5, 10, 20, 50, 100, … within the range
/// of the data; the y axis is logarithmic when `log_y` is set and linear otherwise. Each
/// series is a coloured line with point markers and an entry in the legend; the plot has
/// a title, axis labels and gridlines. On a log axis, zero and negative values are drawn
/// at a small positive floor (a tenth of the smallest positive value). Points that are not
/// finite are left out; when no point remains the SVG says "no data". Text is escaped for
/// XML.
pub fn svg_plot(
    title: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
    log_y: bool,
) -> String {
    let cleaned: Vec<(&str, Vec<(f64, f64)>)> = series
        .iter()
        .map(|(name, points)| {
            let mut kept: Vec<(f64, f64)> = points
                .iter()
                .copied()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .collect();
            kept.sort_by(|a, b| a.0.total_cmp(&b.0));
            (name.as_str(), kept)
        })
        .filter(|(_, points)| !points.is_empty())
        .collect();

    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{cx}\" y=\"28\" text-anchor=\"middle\" font-size=\"16\" \
         font-weight=\"bold\">{title}</text>\n",
        w = SVG_WIDTH,
        h = SVG_HEIGHT,
        cx = coord(SVG_WIDTH / 2.0),
        title = xml_escape(title),
    );
    if cleaned.is_empty() {
        out.push_str(&format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"14\" \
             fill=\"#555\">no data</text>\n</svg>",
            coord(SVG_WIDTH / 2.0),
            coord(SVG_HEIGHT / 2.0),
        ));
        return out;
    }

    let x_floor = log_floor(cleaned.iter().flat_map(|(_, p)| p.iter().map(|(x, _)| *x)));
    let y_floor = log_floor(cleaned.iter().flat_map(|(_, p)| p.iter().map(|(_, y)| *y)));
    let plotted: Vec<(&str, Vec<(f64, f64)>)> = cleaned
        .into_iter()
        .map(|(name, points)| {
            let points = points
                .into_iter()
                .map(|(x, y)| (x.max(x_floor), if log_y { y.max(y_floor) } else { y }))
                .collect();
            (name, points)
        })
        .collect();

    let (mut x_lo, mut x_hi, mut y_lo, mut y_hi) = (
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::INFINITY,
        f64::NEG_INFINITY,
    );
    for (x, y) in plotted.iter().flat_map(|(_, p)| p.iter()) {
        x_lo = x_lo.min(*x);
        x_hi = x_hi.max(*x);
        y_lo = y_lo.min(*y);
        y_hi = y_hi.max(*y);
    }
    let x_axis = Axis::log_x(x_lo, x_hi);
    let y_axis = if log_y {
        Axis::log_y(y_lo, y_hi)
    } else {
        Axis::linear_y(y_lo, y_hi)
    };
    let to_x = |x: f64| PLOT_LEFT + x_axis.fraction(x) * (PLOT_RIGHT - PLOT_LEFT);
    let to_y = |y: f64| PLOT_BOTTOM - y_axis.fraction(y) * (PLOT_BOTTOM - PLOT_TOP);

    // The data's own x values label the axis when no 1-2-5 tick falls within it.
    let x_ticks: Vec<f64> = if x_axis.ticks.is_empty() {
        let distinct: BTreeSet<u64> = plotted
            .iter()
            .flat_map(|(_, p)| p.iter().map(|(x, _)| x.to_bits()))
            .collect();
        distinct.into_iter().map(f64::from_bits).collect()
    } else {
        x_axis.ticks.clone()
    };

    // Gridlines and tick labels.
    out.push_str("<g stroke=\"#e3e3e3\" stroke-width=\"1\">\n");
    for t in &x_ticks {
        let x = coord(to_x(*t));
        out.push_str(&format!(
            "<line x1=\"{x}\" y1=\"{}\" x2=\"{x}\" y2=\"{}\"/>\n",
            coord(PLOT_TOP),
            coord(PLOT_BOTTOM)
        ));
    }
    for t in &y_axis.ticks {
        let y = coord(to_y(*t));
        out.push_str(&format!(
            "<line x1=\"{}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\"/>\n",
            coord(PLOT_LEFT),
            coord(PLOT_RIGHT)
        ));
    }
    out.push_str("</g>\n<g fill=\"#333\">\n");
    for t in &x_ticks {
        out.push_str(&format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
            coord(to_x(*t)),
            coord(PLOT_BOTTOM + 18.0),
            xml_escape(&tick_label(*t))
        ));
    }
    for t in &y_axis.ticks {
        out.push_str(&format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n",
            coord(PLOT_LEFT - 8.0),
            coord(to_y(*t) + 4.0),
            xml_escape(&tick_label(*t))
        ));
    }
    out.push_str("</g>\n");
    out.push_str(&format!(
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n",
        coord(PLOT_LEFT),
        coord(PLOT_TOP),
        coord(PLOT_RIGHT - PLOT_LEFT),
        coord(PLOT_BOTTOM - PLOT_TOP)
    ));

    // Axis labels.
    out.push_str(&format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">contenders N (log scale)</text>\n",
        coord((PLOT_LEFT + PLOT_RIGHT) / 2.0),
        coord(SVG_HEIGHT - 18.0)
    ));
    let y_text = if log_y {
        format!("{y_label} (log scale)")
    } else {
        y_label.to_owned()
    };
    out.push_str(&format!(
        "<text transform=\"translate(20,{}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n",
        coord((PLOT_TOP + PLOT_BOTTOM) / 2.0),
        xml_escape(&y_text)
    ));

    // Lines, markers and legend.
    for (index, (name, points)) in plotted.iter().enumerate() {
        let colour = colour(name, index);
        let coords: Vec<(String, String)> = points
            .iter()
            .map(|(x, y)| (coord(to_x(*x)), coord(to_y(*y))))
            .collect();
        let list: Vec<String> = coords.iter().map(|(x, y)| format!("{x},{y}")).collect();
        out.push_str(&format!(
            "<g>\n<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" \
             points=\"{}\"/>\n",
            list.join(" ")
        ));
        for (x, y) in &coords {
            out.push_str(&format!(
                "<circle cx=\"{x}\" cy=\"{y}\" r=\"3.5\" fill=\"{colour}\"/>\n"
            ));
        }
        let legend_y = PLOT_TOP + 12.0 + 20.0 * index as f64;
        let (start, end) = (PLOT_RIGHT + 16.0, PLOT_RIGHT + 40.0);
        out.push_str(&format!(
            "<line x1=\"{}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"{colour}\" \
             stroke-width=\"2\"/>\n\
             <circle cx=\"{}\" cy=\"{y}\" r=\"3.5\" fill=\"{colour}\"/>\n\
             <text x=\"{}\" y=\"{}\">{}</text>\n</g>\n",
            coord(start),
            coord(end),
            coord((start + end) / 2.0),
            coord(end + 6.0),
            coord(legend_y + 4.0),
            xml_escape(name),
            y = coord(legend_y),
        ));
    }
    out.push_str("</svg>");
    out
}

/// One series per strategy, in the order the strategies first appear, of the points
/// `(contenders, value)` where `value` gives a figure; strategies without any are left out.
fn series_by_strategy(
    measurements: &[Measurement],
    value: impl Fn(&Measurement) -> Option<f64>,
) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for m in measurements {
        let Some(y) = value(m) else { continue };
        let point = (m.contenders as f64, y);
        match series.iter_mut().find(|(name, _)| *name == m.strategy) {
            Some((_, points)) => points.push(point),
            None => series.push((m.strategy.clone(), vec![point])),
        }
    }
    for (_, points) in &mut series {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    series
}

/// The measurement of `strategy` with `contenders`, if the data has one.
fn find<'a>(
    measurements: &'a [Measurement],
    strategy: &str,
    contenders: usize,
) -> Option<&'a Measurement> {
    measurements
        .iter()
        .find(|m| m.strategy == strategy && m.contenders == contenders)
}

/// `numerator / denominator` when that is a finite number.
fn ratio(numerator: f64, denominator: f64) -> Option<f64> {
    let r = numerator / denominator;
    (denominator != 0.0 && r.is_finite()).then_some(r)
}

/// Plain statements with numbers, computed from the measurements; only those whose data
/// is present.
fn findings(measurements: &[Measurement]) -> Vec<String> {
    let counts: BTreeSet<usize> = measurements.iter().map(|m| m.contenders).collect();
    let mut out = Vec::new();

    // Wake-ups per handoff, herd-free against herd.
    let wakeups = |names: &[&str], n: usize| -> Vec<String> {
        names
            .iter()
            .filter_map(|name| {
                let w = find(measurements, name, n)?.wakeups_per_handoff?;
                w.is_finite().then(|| format!("{name} {}", short(w)))
            })
            .collect()
    };
    let (herd_free, herd) = (strategies(Strategy::herd_free), strategies(Strategy::herd));
    for n in &counts {
        let free = wakeups(&herd_free, *n);
        let herd = wakeups(&herd, *n);
        if !free.is_empty() && !herd.is_empty() {
            out.push(format!(
                "At N = {n}, wake-ups per handoff: herd-free {}; herd {}.",
                free.join(", "),
                herd.join(", ")
            ));
        }
    }

    // Throughput of zk-predecessor against zk-single at the largest N both ran.
    let both = counts.iter().rev().find_map(|n| {
        let predecessor = find(measurements, "zk-predecessor", *n)?;
        let single = find(measurements, "zk-single", *n)?;
        Some((*n, predecessor.throughput_per_s, single.throughput_per_s))
    });
    if let Some((n, predecessor, single)) = both {
        out.push(match ratio(predecessor, single) {
            Some(r) => format!(
                "At N = {n}, zk-predecessor throughput is {}× zk-single's \
                 ({} vs {} grants/s).",
                short(r),
                short(predecessor),
                short(single)
            ),
            None => format!(
                "At N = {n}, zk-predecessor throughput is {} grants/s; zk-single's {}.",
                short(predecessor),
                short(single)
            ),
        });
    }

    // Median handoff of the herd-free strategies against their floors.
    for name in herd_free {
        let entries: Vec<String> = counts
            .iter()
            .filter_map(|n| {
                let m = find(measurements, name, *n)?;
                m.handoff_to_floor.is_finite().then(|| {
                    format!(
                        "{}× at N = {n} ({} µs vs {} µs)",
                        short(m.handoff_to_floor),
                        short(m.handoff_p50_us),
                        short(m.floor_p50_us)
                    )
                })
            })
            .collect();
        if !entries.is_empty() {
            out.push(format!(
                "{name} median handoff as a multiple of its floor: {}.",
                entries.join(", ")
            ));
        }
        // Where the floor is the physical one (Redis), the line above says it all.
        let physical: Vec<String> = counts
            .iter()
            .filter_map(|n| {
                let m = find(measurements, name, *n)?;
                let own = m.physical_floor_p50_us > 0.0
                    && m.physical_floor_p50_us != m.floor_p50_us
                    && m.handoff_to_physical_floor.is_finite();
                own.then(|| {
                    format!(
                        "{}× at N = {n} ({} µs vs {} µs)",
                        short(m.handoff_to_physical_floor),
                        short(m.handoff_p50_us),
                        short(m.physical_floor_p50_us)
                    )
                })
            })
            .collect();
        if !physical.is_empty() {
            out.push(format!(
                "{name} median handoff as a multiple of its physical floor: {}.",
                physical.join(", ")
            ));
        }
    }

    // zk-predecessor against the peer recipe, uncontended and at every N both ran.
    for n in counts.iter().copied() {
        let (Some(ours), Some(recipe)) = (
            find(measurements, "zk-predecessor", n),
            find(measurements, "zk-recipe", n),
        ) else {
            continue;
        };
        let label = if n == 1 {
            "Uncontended (N = 1)".to_owned()
        } else {
            format!("At N = {n}")
        };
        let multiple = ratio(ours.handoff_p50_us, recipe.handoff_p50_us)
            .map(|r| format!(" ({}×)", short(r)))
            .unwrap_or_default();
        out.push(format!(
            "{label}, zk-predecessor against zk-recipe: median handoff {} µs vs {} µs{multiple}; \
             throughput {} vs {} grants/s.",
            short(ours.handoff_p50_us),
            short(recipe.handoff_p50_us),
            short(ours.throughput_per_s),
            short(recipe.throughput_per_s)
        ));
    }
    out
}

/// The markdown summary: context, results table, plots and findings.
fn summary(measurements: &[Measurement], scale: &[ScaleMeasurement], context: &str) -> String {
    let mut out = String::from("# distlock herd benchmark\n\n");
    if !context.trim().is_empty() {
        out.push_str(context.trim());
        out.push_str("\n\n");
    }
    out.push_str("## Results\n\n");
    if measurements.is_empty() {
        out.push_str("No measurements.\n\n");
    } else {
        let rows: Vec<Vec<String>> = measurements.iter().map(measurement_cells).collect();
        out.push_str(&markdown_table(&MEASUREMENT_COLUMNS, &rows));
        out.push('\n');
    }
    if !scale.is_empty() {
        out.push_str("## Scale\n\n");
        let rows: Vec<Vec<String>> = scale.iter().map(scale_cells).collect();
        out.push_str(&markdown_table(&SCALE_COLUMNS, &rows));
        out.push('\n');
    }
    out.push_str(
        "## Plots\n\n\
         ![Throughput per second against contenders](throughput.svg)\n\n\
         ![Wake-ups per handoff against contenders](wakeups.svg)\n\n\
         ![Median handoff against contenders](handoff_p50.svg)\n\n\
         ## Findings\n\n",
    );
    let found = findings(measurements);
    if found.is_empty() {
        out.push_str("The data holds none of the comparisons this summary draws.\n");
    } else {
        for line in found {
            out.push_str(&format!("- {line}\n"));
        }
    }
    out
}

/// Writes the report of a run into `dir`, creating it: `throughput.svg` (grants per
/// second against contenders, log y), `wakeups.svg` (wake-ups per handoff, log y, one line
/// per strategy that counts them), `handoff_p50.svg` (median handoff in µs),
/// `results.json` (the measurements as a pretty JSON array), `scale.json` (only when
/// `scale` is not empty) and `summary.md` (`context`, the results as a markdown table,
/// the plots, and findings computed from the data).
///
/// Returns the paths written, in that order.
///
/// # Errors
///
/// The first error creating the directory or writing a file.
pub fn write_report(
    dir: &Path,
    measurements: &[Measurement],
    scale: &[ScaleMeasurement],
    context: &str,
) -> io::Result<Vec<PathBuf>> {
    fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    let mut write = |name: &str, contents: String| -> io::Result<()> {
        let path = dir.join(name);
        fs::write(&path, contents)?;
        written.push(path);
        Ok(())
    };

    let plots = [
        (
            "throughput.svg",
            "Throughput against contenders",
            "grants per second",
            series_by_strategy(measurements, |m| Some(m.throughput_per_s)),
            true,
        ),
        (
            "wakeups.svg",
            "Wake-ups per handoff against contenders",
            "wake-ups per handoff",
            series_by_strategy(measurements, |m| m.wakeups_per_handoff),
            true,
        ),
        (
            "handoff_p50.svg",
            "Median handoff against contenders",
            "median handoff (µs)",
            series_by_strategy(measurements, |m| Some(m.handoff_p50_us)),
            false,
        ),
    ];
    for (file, title, y_label, series, log_y) in plots {
        write(file, svg_plot(title, y_label, &series, log_y) + "\n")?;
    }
    write(
        "results.json",
        serde_json::to_string_pretty(measurements)? + "\n",
    )?;
    if !scale.is_empty() {
        write("scale.json", serde_json::to_string_pretty(scale)? + "\n")?;
    }
    write("summary.md", summary(measurements, scale, context))?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measurement(
        strategy: &str,
        contenders: usize,
        throughput: f64,
        p50: f64,
        wakeups: Option<f64>,
    ) -> Measurement {
        let backend = if strategy.starts_with("zk") {
            "zookeeper"
        } else {
            "redis"
        };
        let mut m = Measurement::new(strategy, backend, contenders);
        m.handoffs = 1000;
        m.throughput_per_s = throughput;
        m.handoff_p50_us = p50;
        m.handoff_p99_us = p50 * 3.0;
        m.floor_p50_us = 400.0;
        m.handoff_to_floor = p50 / 400.0;
        m.physical_floor_p50_us = 250.0;
        m.handoff_to_physical_floor = p50 / 250.0;
        m.hold_p50_us = 1010.0;
        m.wakeups_per_handoff = wakeups;
        m.futile_wakeups_per_handoff = wakeups.map(|w| w - 1.0);
        m.server_requests_per_handoff = wakeups.map(|w| w * 2.0);
        m.min_grants = 10;
        m.max_grants = 12;
        m
    }

    fn data() -> Vec<Measurement> {
        let mut all = Vec::new();
        for n in [1, 10, 50, 100] {
            let nf = n as f64;
            all.push(measurement(
                "zk-single",
                n,
                2000.0 / nf,
                500.0 * nf,
                Some(nf * 0.987),
            ));
            all.push(measurement(
                "zk-children",
                n,
                1900.0 / nf,
                520.0 * nf,
                Some(nf),
            ));
            all.push(measurement("zk-predecessor", n, 2000.0, 500.0, Some(1.0)));
            all.push(measurement("zk-recipe", n, 1900.0, 520.0, None));
            all.push(measurement("redis-pubsub", n, 3000.0, 300.0, Some(nf)));
            all.push(measurement("redis-queue", n, 4000.0, 250.0, Some(1.0)));
        }
        all
    }

    #[test]
    fn table_has_a_row_per_measurement_and_dashes_for_none() {
        let ms = vec![
            measurement("zk-predecessor", 10, 1234.5, 600.0, Some(1.0)),
            measurement("zk-recipe", 10, 1200.0, 610.0, None),
        ];
        let text = table(&ms);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2 + ms.len());
        assert!(lines[0].starts_with("strategy"));
        assert!(lines[0].contains("wake-ups/handoff"));
        assert!(lines[0].contains("FIFO violations"));
        assert!(lines[2].starts_with("zk-predecessor"));
        assert!(lines[2].contains("1234.5"));
        assert!(lines[2].contains("10–12"));
        assert!(lines[3].starts_with("zk-recipe"));
        assert!(lines[3].contains('–'));
        assert_eq!(lines[3].matches(" –").count(), 3);
        assert!(!lines[2].contains(" –"));
        // Right-aligned numbers end in the same column.
        let header_width = lines[0].chars().count();
        assert_eq!(lines[1].chars().count(), header_width);
        assert_eq!(lines[2].chars().count(), header_width);
    }

    #[test]
    fn table_of_nothing_is_a_header() {
        assert_eq!(table(&[]).lines().count(), 2);
    }

    #[test]
    fn scale_table_has_a_row_per_run() {
        let run = ScaleMeasurement {
            strategy: "zookeeper zk-predecessor".to_owned(),
            locks: 10_000,
            acquire_per_s: 812.3,
            release_per_s: 901.0,
            rss_bytes_per_lock: 412.0,
            rss_bytes_per_lock_first_round: 900.0,
            leftovers: 0,
        };
        let text = scale_table(&[run.clone(), run]);
        assert_eq!(text.lines().count(), 4);
        assert!(text.contains("10000"));
        assert!(text.contains("812.3"));
    }

    fn two_series() -> Vec<(String, Vec<(f64, f64)>)> {
        vec![
            (
                "zk-single".to_owned(),
                vec![(1.0, 1.0), (10.0, 9.8), (100.0, 98.7)],
            ),
            (
                "zk-predecessor".to_owned(),
                vec![(1.0, 1.0), (10.0, 1.0), (100.0, 1.0)],
            ),
        ]
    }

    #[test]
    fn svg_has_a_line_per_series_and_escapes_text() {
        for log_y in [false, true] {
            let svg = svg_plot("wake-ups <&> N", "per \"handoff\"", &two_series(), log_y);
            assert!(svg.starts_with("<svg"));
            assert!(svg.ends_with("</svg>"));
            assert_eq!(svg.matches("<polyline").count(), 2);
            assert!(svg.contains("wake-ups &lt;&amp;&gt; N"));
            assert!(!svg.contains("<&"));
            assert!(svg.contains("per &quot;handoff&quot;"));
            assert!(svg.contains(">zk-single</text>"));
            assert!(svg.contains(">zk-predecessor</text>"));
            assert!(!svg.contains("NaN"));
            assert!(!svg.contains("inf"));
            for tick in [
                ">1</text>",
                ">2</text>",
                ">5</text>",
                ">10</text>",
                ">100</text>",
            ] {
                assert!(svg.contains(tick), "missing x tick {tick}");
            }
            assert!(!svg.contains(">200</text>"));
        }
    }

    #[test]
    fn svg_of_nothing_says_no_data() {
        let svg = svg_plot("empty", "y", &[], true);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(svg.contains("no data"));
        let only_nan = vec![("s".to_owned(), vec![(f64::NAN, 1.0), (2.0, f64::INFINITY)])];
        let svg = svg_plot("empty", "y", &only_nan, false);
        assert!(svg.contains("no data"));
        assert_eq!(svg.matches("<polyline").count(), 0);
    }

    #[test]
    fn svg_of_a_single_point_and_of_zeros_draws() {
        for log_y in [false, true] {
            let single = vec![("one".to_owned(), vec![(5.0, 42.0)])];
            let svg = svg_plot("one", "y", &single, log_y);
            assert!(svg.ends_with("</svg>"));
            assert_eq!(svg.matches("<polyline").count(), 1);
            assert!(!svg.contains("NaN"));

            let zeros = vec![
                (
                    "zero".to_owned(),
                    vec![(0.0, 0.0), (1.0, -3.0), (10.0, 0.0)],
                ),
                ("same".to_owned(), vec![(3.0, 7.0), (4.0, 7.0)]),
            ];
            let svg = svg_plot("zeros", "y", &zeros, log_y);
            assert_eq!(svg.matches("<polyline").count(), 2);
            assert!(!svg.contains("NaN"));
            assert!(!svg.contains("inf"));
        }
    }

    #[test]
    fn write_report_writes_every_file_and_states_findings() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("report");
        let scale = vec![ScaleMeasurement {
            strategy: "redis redis-queue".to_owned(),
            locks: 1000,
            acquire_per_s: 5000.0,
            release_per_s: 6000.0,
            rss_bytes_per_lock: 100.0,
            rss_bytes_per_lock_first_round: 300.0,
            leftovers: 0,
        }];
        let ms = data();
        let written = write_report(&out, &ms, &scale, "host x, 2025-01-01, `cargo run`").unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "throughput.svg",
                "wakeups.svg",
                "handoff_p50.svg",
                "results.json",
                "scale.json",
                "summary.md"
            ]
        );
        for path in &written {
            assert!(path.is_file(), "{} missing", path.display());
        }

        let wakeups = fs::read_to_string(out.join("wakeups.svg")).unwrap();
        // zk-recipe keeps no count: five lines, not six.
        assert_eq!(wakeups.matches("<polyline").count(), 5);
        assert!(!wakeups.contains("zk-recipe"));
        let throughput = fs::read_to_string(out.join("throughput.svg")).unwrap();
        assert_eq!(throughput.matches("<polyline").count(), 6);

        let json: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
        assert_eq!(json.as_array().map(Vec::len), Some(ms.len()));
        assert_eq!(json[0]["strategy"], "zk-single");
        assert!(json[3]["wakeups_per_handoff"].is_null());

        let summary = fs::read_to_string(out.join("summary.md")).unwrap();
        assert!(summary.contains("host x, 2025-01-01, `cargo run`"));
        assert!(summary.contains("| strategy | N |"));
        assert!(summary.contains("![Throughput per second against contenders](throughput.svg)"));
        assert!(summary.contains("(wakeups.svg)"));
        assert!(summary.contains("(handoff_p50.svg)"));
        assert!(summary.contains(
            "At N = 100, wake-ups per handoff: herd-free zk-predecessor 1.00, redis-queue 1.00; \
             herd zk-single 98.7, zk-children 100, redis-pubsub 100."
        ));
        assert!(summary.contains("At N = 10, wake-ups per handoff"));
        assert!(summary.contains(
            "At N = 100, zk-predecessor throughput is 100× zk-single's (2000 vs 20.0 grants/s)."
        ));
        assert!(
            summary.contains(
                "zk-predecessor median handoff as a multiple of its floor: 1.25× at N = 1"
            )
        );
        assert!(summary.contains("redis-queue median handoff as a multiple of its floor: "));
        assert!(summary.contains(
            "zk-predecessor median handoff as a multiple of its physical floor: 2.00× at N = 1 \
             (500 µs vs 250 µs)"
        ));
        assert!(summary.contains("| hold µs |"));
        // The peer is herd-free too: its floor line is there, its (uncounted) wake-ups not.
        assert!(
            summary.contains("zk-recipe median handoff as a multiple of its floor: 1.30× at N = 1")
        );
        assert!(!summary.contains("herd-free zk-predecessor 1.00, zk-recipe"));
        assert!(summary.contains(
            "Uncontended (N = 1), zk-predecessor against zk-recipe: median handoff 500 µs vs \
             520 µs (0.96×)"
        ));
        assert!(summary.contains("At N = 50, zk-predecessor against zk-recipe"));
        assert!(summary.contains("## Scale"));
    }

    #[test]
    fn write_report_states_only_findings_whose_data_is_present() {
        let dir = tempfile::tempdir().unwrap();
        let ms = vec![
            measurement("zk-single", 5, 100.0, 900.0, Some(4.0)),
            measurement("redis-polling", 5, 80.0, 1500.0, Some(7.0)),
        ];
        let written = write_report(dir.path(), &ms, &[], "ctx").unwrap();
        assert_eq!(written.len(), 5);
        assert!(!dir.path().join("scale.json").exists());
        let summary = fs::read_to_string(dir.path().join("summary.md")).unwrap();
        assert!(!summary.contains("herd-free"));
        assert!(!summary.contains("zk-predecessor"));
        assert!(!summary.contains("## Scale"));
        assert!(summary.contains("none of the comparisons"));

        let empty = dir.path().join("empty");
        let written = write_report(&empty, &[], &[], "").unwrap();
        assert_eq!(written.len(), 5);
        let svg = fs::read_to_string(empty.join("throughput.svg")).unwrap();
        assert!(svg.contains("no data"));
        assert_eq!(
            fs::read_to_string(empty.join("results.json")).unwrap(),
            "[]\n"
        );
    }
}
