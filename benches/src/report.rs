//! Reports of the herd scenario: aligned tables for the terminal, SVG line plots drawn
//! with plotters, and a markdown summary whose findings are computed from the measurements.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

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
const SCALE_COLUMNS: [(&str, bool); 12] = [
    ("strategy", true),
    ("locks", false),
    ("acquire/s", false),
    ("release/s", false),
    ("RSS B/lock", false),
    ("first round", false),
    ("server B/lock", false),
    ("leftovers", false),
    ("all lost ms", false),
    ("server end ms", false),
    ("server end: lost ms", false),
    ("requests", false),
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
/// growth per lock in the second round and the first, the server's memory growth per lock,
/// locks left on the server, how long after the provider's close the last lost signal
/// fired, and after the server ended a session, with the requests sent meanwhile).
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
        optional(m.server_bytes_per_lock, 1),
        m.leftovers.to_string(),
        fixed(m.all_lost_ms, 1),
        optional(m.server_end_ms, 1),
        optional(m.server_end_lost_ms, 1),
        m.server_end_requests
            .map_or_else(|| "–".to_owned(), |requests| requests.to_string()),
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

/// What drawing on the SVG backend can fail with.
type DrawError = DrawingAreaErrorKind<io::Error>;

/// Size of each plot, in pixels.
const SVG_SIZE: (u32, u32) = (760, 460);
/// Room right of the plotting area, where the legend goes so that it hides no data.
const LEGEND_WIDTH: u32 = 190;
/// Space around the plotting area and its axis labels, in pixels.
const MARGIN: i32 = 12;
/// The font of every text in the plots.
const FONT: &str = "sans-serif";
/// The size of labels and legend, as handed to plotters, whose SVG backend writes
/// `font-size` as the size given divided by 1.24: 12 px text.
const TEXT_SIZE: f64 = 15.0;
/// The size of the title, likewise: 16 px text.
const TITLE_SIZE: f64 = 20.0;
/// The colour of the gridlines.
const GRID: RGBColor = RGBColor(0xe3, 0xe3, 0xe3);
/// The colour of the axes, the frame and the labels.
const INK: RGBColor = RGBColor(0x33, 0x33, 0x33);
/// The colour of the "no data" note.
const NOTE: RGBColor = RGBColor(0x55, 0x55, 0x55);

/// Colours for series without a colour of their own (Okabe–Ito and a few more).
const PALETTE: [RGBColor; 10] = [
    RGBColor(0x00, 0x72, 0xB2),
    RGBColor(0xD5, 0x5E, 0x00),
    RGBColor(0x00, 0x9E, 0x73),
    RGBColor(0xCC, 0x79, 0xA7),
    RGBColor(0xE6, 0x9F, 0x00),
    RGBColor(0x56, 0xB4, 0xE9),
    RGBColor(0x00, 0x00, 0x00),
    RGBColor(0x7F, 0x7F, 0x7F),
    RGBColor(0x8C, 0x56, 0x4B),
    RGBColor(0xB8, 0xA8, 0x00),
];

/// The colour of a series: the known strategies keep theirs across plots (herd ones warm,
/// herd-free ones cool); others take one from the palette by position.
fn colour(name: &str, index: usize) -> RGBColor {
    match name {
        "zk-single" => RGBColor(0xD5, 0x5E, 0x00),
        "zk-children" => RGBColor(0xE6, 0x9F, 0x00),
        "zk-predecessor" => RGBColor(0x00, 0x72, 0xB2),
        "zk-recipe" => RGBColor(0x56, 0xB4, 0xE9),
        "redis-polling" => RGBColor(0x7F, 0x7F, 0x7F),
        "redis-pubsub" => RGBColor(0xCC, 0x79, 0xA7),
        "redis-queue" => RGBColor(0x00, 0x9E, 0x73),
        "etcd-single" => RGBColor(0x99, 0x33, 0x00),
        "etcd-prefix" => RGBColor(0xF0, 0xE4, 0x42),
        "etcd-predecessor" => RGBColor(0x33, 0x22, 0x88),
        "etcd-v3lock" => RGBColor(0x88, 0xCC, 0xEE),
        "pg-advisory" => RGBColor(0x11, 0x77, 0x33),
        "pg-notify" => RGBColor(0xAA, 0x44, 0x99),
        "pg-polling" => RGBColor(0x44, 0x44, 0x44),
        _ => PALETTE[index % PALETTE.len()],
    }
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
/// would give too many. (Plotters' own log axis ticks only decades, or every integer
/// multiple of one, which crowds the labels.)
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

/// The x range for the positive values `lo..=hi` on a log axis, padded a little each side.
fn log_x_range(lo: f64, hi: f64) -> Range<f64> {
    let (lo, hi) = if hi / lo < 1.0001 {
        (lo / 2.0, hi * 2.0)
    } else {
        (lo, hi)
    };
    let padding = (hi / lo).log10() * 0.06;
    lo / 10f64.powf(padding)..hi * 10f64.powf(padding)
}

/// The y range for the positive values `lo..=hi` on a log axis, widened to whole decades.
fn log_y_range(lo: f64, hi: f64) -> Range<f64> {
    let l = lo.log10().floor();
    let mut h = hi.log10().ceil();
    if h <= l {
        h = l + 1.0;
    }
    10f64.powf(l)..10f64.powf(h)
}

/// The y range for `lo..=hi` on a linear axis: from zero (or below, for negative values)
/// to a little past `hi`.
fn linear_y_range(lo: f64, hi: f64) -> Range<f64> {
    let lo = lo.min(0.0);
    let hi = if hi > lo { hi } else { lo + 1.0 };
    lo..hi + (hi - lo) * 0.05
}

/// A self-contained SVG line plot of `series` (name and `(contenders, value)` points)
/// against the number of contenders, drawn with plotters' SVG backend.
///
/// The x axis is logarithmic with ticks at 1, 2, 5, 10, 20, 50, 100, … within the range
/// of the data; the y axis is logarithmic (whole decades, the same ticks) when `log_y` is
/// set and linear from zero otherwise. Each series is a coloured line with point markers
/// and an entry in the legend, right of the plotting area; the plot has a title, axis
/// labels and gridlines. On a log axis, zero and negative values are drawn at a small
/// positive floor (a tenth of the smallest positive value). Points that are not finite are
/// left out; when no point remains the SVG says "no data". Text is escaped for XML.
///
/// # Errors
///
/// An error of the drawing, as [`io::ErrorKind::Other`].
pub fn svg_plot(
    title: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
    log_y: bool,
) -> io::Result<String> {
    svg_plot_over(title, "contenders N (log scale)", y_label, series, log_y)
}

/// The plot of [`svg_plot`] against another quantity than the contenders, named by
/// `x_label` (the locks held at once, say).
///
/// # Errors
///
/// An error of the drawing, as [`io::ErrorKind::Other`].
pub fn svg_plot_over(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
    log_y: bool,
) -> io::Result<String> {
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
    let mut svg = String::new();
    draw_plot(&mut svg, title, (x_label, y_label), cleaned, log_y)
        .map_err(|error| io::Error::other(format!("drawing the plot {title:?}: {error}")))?;
    Ok(svg.trim_end().to_owned())
}

/// Draws the plot of [`svg_plot`] from its finite, sorted, non-empty series into `svg`.
fn draw_plot(
    svg: &mut String,
    title: &str,
    (x_label, y_label): (&str, &str),
    cleaned: Vec<(&str, Vec<(f64, f64)>)>,
    log_y: bool,
) -> Result<(), DrawError> {
    let root = SVGBackend::with_string(svg, SVG_SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let title_style = (FONT, TITLE_SIZE)
        .into_font()
        .style(FontStyle::Bold)
        .color(&BLACK);
    if cleaned.is_empty() {
        let centre = |style: TextStyle<'static>| style.pos(Pos::new(HPos::Center, VPos::Center));
        let (w, h) = (SVG_SIZE.0 as i32, SVG_SIZE.1 as i32);
        root.draw_text(title, &centre(title_style), (w / 2, MARGIN + 10))?;
        let note = (FONT, TEXT_SIZE * 14.0 / 12.0).into_font().color(&NOTE);
        root.draw_text("no data", &centre(note), (w / 2, h / 2))?;
        return root.present();
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
    let bounds = |pick: fn(&(f64, f64)) -> f64| {
        plotted
            .iter()
            .flat_map(|(_, p)| p.iter().map(pick))
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            })
    };
    let (x_lo, x_hi) = bounds(|p| p.0);
    let (y_lo, y_hi) = bounds(|p| p.1);

    let x_range = log_x_range(x_lo, x_hi);
    // The data's own x values label the axis when no 1-2-5 tick falls within it.
    let mut x_ticks = log_ticks(x_range.start, x_range.end);
    if x_ticks.is_empty() {
        let distinct: BTreeSet<u64> = plotted
            .iter()
            .flat_map(|(_, p)| p.iter().map(|(x, _)| x.to_bits()))
            .collect();
        x_ticks = distinct.into_iter().map(f64::from_bits).collect();
    }
    let x = x_range.log_scale().with_key_points(x_ticks);
    let parts = Parts {
        title,
        title_style,
        x_label,
        plotted: &plotted,
    };
    if log_y {
        let range = log_y_range(y_lo, y_hi);
        let ticks = log_ticks(range.start, range.end);
        let y = range.log_scale().with_key_points(ticks);
        parts.draw(&root, x, y, &format!("{y_label} (log scale)"))?;
    } else {
        let y: RangedCoordf64 = linear_y_range(y_lo, y_hi).into();
        parts.draw(&root, x, y, y_label)?;
    }
    root.present()
}

/// What a plot shows besides its axes.
struct Parts<'a> {
    /// The title, above the plot.
    title: &'a str,
    /// The title's font, size and colour.
    title_style: TextStyle<'a>,
    /// What the x axis counts.
    x_label: &'a str,
    /// The series, by name, with their points as they are drawn.
    plotted: &'a [(&'a str, Vec<(f64, f64)>)],
}

impl Parts<'_> {
    /// Draws the title, the mesh and axes, the series and the legend on `root`.
    fn draw<X, Y>(
        &self,
        root: &DrawingArea<SVGBackend<'_>, Shift>,
        x: X,
        y: Y,
        y_text: &str,
    ) -> Result<(), DrawError>
    where
        X: Ranged<ValueType = f64> + ValueFormatter<f64>,
        Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
    {
        let body = root
            .margin(MARGIN, 0, 0, 0)
            .titled(self.title, self.title_style.clone())?;
        let (plot_area, legend_area) = body.split_horizontally(SVG_SIZE.0 - LEGEND_WIDTH);
        let mut chart = ChartBuilder::on(&plot_area)
            .margin(MARGIN)
            .x_label_area_size(48)
            .y_label_area_size(72)
            .build_cartesian_2d(x, y)?;
        let label_style = (FONT, TEXT_SIZE).into_font().color(&INK);
        let formatter = |v: &f64| tick_label(*v);
        chart
            .configure_mesh()
            .max_light_lines(0)
            // Log axes have their ticks bound above; this leaves plotters' own on a linear y.
            .y_labels(8)
            .bold_line_style(GRID)
            .axis_style(INK)
            .label_style(label_style.clone())
            .axis_desc_style(label_style.clone())
            .x_label_formatter(&formatter)
            .y_label_formatter(&formatter)
            .x_desc(self.x_label)
            .y_desc(y_text)
            .draw()?;
        // The axes close the plotting area left and below; a line closes it above and right.
        let frame = chart.plotting_area().strip_coord_spec();
        let (width, height) = frame.dim_in_pixel();
        let last = |pixels: u32| i32::try_from(pixels).unwrap_or(i32::MAX) - 1;
        let (right, bottom) = (last(width), last(height));
        frame.draw(&PathElement::new(
            [(0, 0), (right, 0), (right, bottom)],
            INK.stroke_width(1),
        ))?;
        let legend_text = label_style.pos(Pos::new(HPos::Left, VPos::Center));
        for (index, (name, points)) in self.plotted.iter().enumerate() {
            let colour = colour(name, index);
            let line = colour.stroke_width(2);
            chart.draw_series(LineSeries::new(points.iter().copied(), line))?;
            chart.draw_series(
                points
                    .iter()
                    .map(|point| Circle::new(*point, 3, colour.filled())),
            )?;
            // The legend lies right of the plotting area (plotters keeps what is drawn on that
            // area within it), so that it hides no data: a line, a marker and the name.
            let row = i32::try_from(index).unwrap_or(i32::MAX);
            let y = row.saturating_mul(20).saturating_add(MARGIN + 12);
            legend_area.draw(&PathElement::new([(4, y), (28, y)], line))?;
            legend_area.draw(&Circle::new((16, y), 3, colour.filled()))?;
            legend_area.draw(&Text::new(*name, (36, y), legend_text.clone()))?;
        }
        Ok(())
    }
}

/// One series per strategy, in the order the strategies first appear, of the points
/// `(contenders, value)` where `value` gives a figure; strategies without any are left out.
fn series_by_strategy(
    measurements: &[Measurement],
    value: impl Fn(&Measurement) -> Option<f64>,
) -> Vec<(String, Vec<(f64, f64)>)> {
    series_of(
        measurements
            .iter()
            .map(|m| (m.strategy.as_str(), m.contenders as f64, value(m))),
    )
}

/// The series of a scale plot: one line per strategy, against the locks held.
fn scale_series(
    scale: &[ScaleMeasurement],
    value: impl Fn(&ScaleMeasurement) -> Option<f64>,
) -> Vec<(String, Vec<(f64, f64)>)> {
    series_of(
        scale
            .iter()
            .map(|m| (m.strategy.as_str(), m.locks as f64, value(m))),
    )
}

/// `(strategy, x, y)` points gathered into one series per strategy, in the order the
/// strategies first come, each sorted by x; points without a y are left out.
fn series_of<'a>(
    points: impl Iterator<Item = (&'a str, f64, Option<f64>)>,
) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for (strategy, x, y) in points {
        let Some(y) = y else { continue };
        match series.iter_mut().find(|(name, _)| name == strategy) {
            Some((_, points)) => points.push((x, y)),
            None => series.push((strategy.to_owned(), vec![(x, y)])),
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

/// How many times its median a row's p99 handoff must exceed for the findings to name it:
/// beyond that, the median alone misdescribes the row.
const WIDE_TAIL: f64 = 10.0;

/// `m`'s p99 as a multiple of its median, when it is more than [`WIDE_TAIL`] times it.
fn wide_tail(m: &Measurement) -> Option<f64> {
    ratio(m.handoff_p99_us, m.handoff_p50_us).filter(|r| *r > WIDE_TAIL)
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

    // Ours against each peer, uncontended and at every N both ran.
    for (ours_name, peer_name) in [
        ("zk-predecessor", "zk-recipe"),
        ("etcd-predecessor", "etcd-v3lock"),
    ] {
        for n in counts.iter().copied() {
            let (Some(ours), Some(peer)) = (
                find(measurements, ours_name, n),
                find(measurements, peer_name, n),
            ) else {
                continue;
            };
            let label = if n == 1 {
                "Uncontended (N = 1)".to_owned()
            } else {
                format!("At N = {n}")
            };
            let multiple = ratio(ours.handoff_p50_us, peer.handoff_p50_us)
                .map(|r| format!(" ({}×)", short(r)))
                .unwrap_or_default();
            // Medians alone would hide a tail that either side has and the other not.
            let tails = if wide_tail(ours).is_some() || wide_tail(peer).is_some() {
                format!(
                    "; p99 {} µs vs {} µs",
                    short(ours.handoff_p99_us),
                    short(peer.handoff_p99_us)
                )
            } else {
                String::new()
            };
            out.push(format!(
                "{label}, {ours_name} against {peer_name}: median handoff {} µs vs {} µs{multiple}{tails}; \
                 throughput {} vs {} grants/s.",
                short(ours.handoff_p50_us),
                short(peer.handoff_p50_us),
                short(ours.throughput_per_s),
                short(peer.throughput_per_s)
            ));
        }
    }

    // Rows whose p99 is far beyond their median, whatever the strategy.
    for name in strategies(|_| true) {
        let entries: Vec<String> = counts
            .iter()
            .filter_map(|n| {
                let m = find(measurements, name, *n)?;
                wide_tail(m).map(|r| {
                    format!(
                        "{}× at N = {n} ({} µs vs {} µs)",
                        short(r),
                        short(m.handoff_p99_us),
                        short(m.handoff_p50_us)
                    )
                })
            })
            .collect();
        if !entries.is_empty() {
            out.push(format!(
                "{name} p99 handoff is more than {WIDE_TAIL:.0}× its median: {}.",
                entries.join(", ")
            ));
        }
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
        out.push_str(
            "\n![Client memory per held lock](scale_client_memory.svg)\n\n\
             ![Acquisitions per second](scale_acquisitions.svg)\n\n\
             ![Server memory per held lock](scale_server_memory.svg)\n\n",
        );
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
/// `results.json` (the measurements as a pretty JSON array), when `scale` is not empty
/// `scale.json` and its plots against the locks held (`scale_client_memory.svg`,
/// `scale_acquisitions.svg` with a log y, `scale_server_memory.svg`), and `summary.md`
/// (`context`, the results as markdown tables, the plots, and findings computed from the
/// data).
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
        write(file, svg_plot(title, y_label, &series, log_y)? + "\n")?;
    }
    write(
        "results.json",
        serde_json::to_string_pretty(measurements)? + "\n",
    )?;
    if !scale.is_empty() {
        write("scale.json", serde_json::to_string_pretty(scale)? + "\n")?;
        let locks = "locks held at once (log scale)";
        let plots = [
            (
                "scale_client_memory.svg",
                "Client memory per held lock, first round from a fresh process",
                "bytes per held lock",
                scale_series(scale, |m| Some(m.rss_bytes_per_lock_first_round)),
                false,
            ),
            (
                "scale_acquisitions.svg",
                "Acquisitions per second from one provider",
                "acquisitions per second",
                scale_series(scale, |m| Some(m.acquire_per_s)),
                true,
            ),
            // Linear: a server's figure can fall between two readings (a collector ran).
            (
                "scale_server_memory.svg",
                "Server memory per held lock",
                "bytes per held lock",
                scale_series(scale, |m| m.server_bytes_per_lock),
                false,
            ),
        ];
        for (file, title, y_label, series, log_y) in plots {
            write(
                file,
                svg_plot_over(title, locks, y_label, &series, log_y)? + "\n",
            )?;
        }
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
            server_bytes_per_lock: Some(310.0),
            leftovers: 0,
            all_lost_ms: 41.5,
            server_end_lost_ms: Some(63.0),
            server_end_ms: Some(12.0),
            server_end_requests: Some(1),
        };
        let text = scale_table(&[run.clone(), run]);
        assert_eq!(text.lines().count(), 4);
        assert!(text.contains("10000"));
        assert!(text.contains("812.3"));
        assert!(text.contains("41.5"));
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

    /// `svg` parsed as XML, which it must be, with an `svg` root.
    fn parse(svg: &str) -> roxmltree::Document<'_> {
        let doc = roxmltree::Document::parse(svg).expect("the plot is not well-formed XML");
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        doc
    }

    /// The text of each `<text>` element of `svg`, trimmed, in order.
    fn texts(svg: &str) -> Vec<String> {
        parse(svg)
            .descendants()
            .filter(|n| n.tag_name().name() == "text")
            .map(|n| n.text().unwrap_or_default().trim().to_owned())
            .collect()
    }

    /// Series drawn in `svg`: each draws two lines 2 px wide in its colour, its own and the
    /// one of its legend entry. `colour` picks the series of one colour; `None` counts all.
    fn series_drawn(svg: &str, colour: Option<&str>) -> usize {
        let lines = parse(svg)
            .descendants()
            .filter(|n| {
                n.tag_name().name() == "polyline"
                    && n.attribute("stroke-width") == Some("2")
                    && colour.is_none_or(|c| n.attribute("stroke") == Some(c))
            })
            .count();
        assert_eq!(
            lines % 2,
            0,
            "a line without a legend entry, or the reverse"
        );
        lines / 2
    }

    /// Where the numeric tick labels with `anchor` (`middle`: x axis, `end`: y axis) are
    /// placed along their axis, by value.
    fn ticks(svg: &str, anchor: &str) -> Vec<(f64, f64)> {
        let along = if anchor == "end" { "y" } else { "x" };
        parse(svg)
            .descendants()
            .filter(|n| n.tag_name().name() == "text" && n.attribute("text-anchor") == Some(anchor))
            .filter_map(|n| {
                let value: f64 = n.text()?.trim().parse().ok()?;
                let at: f64 = n.attribute(along)?.parse().ok()?;
                Some((value, at))
            })
            .collect()
    }

    /// The position of the tick labelled `value`.
    fn at(ticks: &[(f64, f64)], value: f64) -> f64 {
        ticks
            .iter()
            .find(|(v, _)| *v == value)
            .map(|(_, at)| *at)
            .unwrap_or_else(|| panic!("no tick {value} in {ticks:?}"))
    }

    #[test]
    fn svg_has_a_line_per_series_and_escapes_text() {
        for log_y in [false, true] {
            let svg = svg_plot("wake-ups <&> N", "per \"handoff\"", &two_series(), log_y).unwrap();
            assert!(svg.starts_with("<svg"));
            assert!(svg.ends_with("</svg>"));
            assert_eq!(series_drawn(&svg, None), 2);
            assert_eq!(series_drawn(&svg, Some("#D55E00")), 1, "zk-single's colour");
            assert_eq!(
                series_drawn(&svg, Some("#0072B2")),
                1,
                "zk-predecessor's colour"
            );
            assert!(svg.contains("wake-ups &lt;&amp;&gt; N"));
            assert!(!svg.contains("<&"));
            assert!(svg.contains("per &quot;handoff&quot;"));
            assert!(!svg.contains("NaN"));
            assert!(!svg.contains("inf"));

            let texts = texts(&svg);
            let y_title = if log_y {
                "per \"handoff\" (log scale)"
            } else {
                "per \"handoff\""
            };
            for text in [
                "wake-ups <&> N",
                "contenders N (log scale)",
                y_title,
                "zk-single",
                "zk-predecessor",
            ] {
                assert!(
                    texts.iter().any(|t| t == text),
                    "missing {text:?} in {texts:?}"
                );
            }

            // The x axis is logarithmic with 1-2-5 ticks within the data.
            let x = ticks(&svg, "middle");
            let values: Vec<f64> = x.iter().map(|(v, _)| *v).collect();
            assert_eq!(values, [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]);
            let decade = at(&x, 10.0) - at(&x, 1.0);
            assert!(decade > 100.0);
            assert!((at(&x, 100.0) - at(&x, 10.0) - decade).abs() <= 1.0);
            assert!((at(&x, 2.0) - at(&x, 1.0) - decade * 2f64.log10()).abs() <= 1.0);

            let y = ticks(&svg, "end");
            if log_y {
                // Whole decades, as many pixels each.
                let (low, high) = (at(&y, 1.0), at(&y, 100.0));
                assert!(y.iter().all(|(_, at)| (high..=low).contains(at)));
                assert!((low - at(&y, 10.0) - (at(&y, 10.0) - high)).abs() <= 1.0);
                assert!((low - at(&y, 2.0) - (low - high) / 2.0 * 2f64.log10()).abs() <= 1.0);
            } else {
                // Linear from zero: equal steps in value take equal steps in pixels.
                assert_eq!(y.first().map(|(v, _)| *v), Some(0.0));
                let per_unit: Vec<f64> = y
                    .windows(2)
                    .map(|w| (w[0].1 - w[1].1) / (w[1].0 - w[0].0))
                    .collect();
                assert!(per_unit.len() >= 3);
                assert!(per_unit.iter().all(|p| (p - per_unit[0]).abs() < 0.05));
                assert!(y.iter().any(|(v, _)| *v >= 98.7 * 0.8));
            }
        }
    }

    #[test]
    fn svg_of_nothing_says_no_data() {
        let svg = svg_plot("empty", "y", &[], true).unwrap();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert_eq!(texts(&svg), ["empty", "no data"]);
        let only_nan = vec![("s".to_owned(), vec![(f64::NAN, 1.0), (2.0, f64::INFINITY)])];
        let svg = svg_plot("empty", "y", &only_nan, false).unwrap();
        assert_eq!(texts(&svg), ["empty", "no data"]);
        assert_eq!(svg.matches("<polyline").count(), 0);
    }

    #[test]
    fn svg_of_a_single_point_and_of_zeros_draws() {
        for log_y in [false, true] {
            let single = vec![("one".to_owned(), vec![(5.0, 42.0)])];
            let svg = svg_plot("one", "y", &single, log_y).unwrap();
            assert!(svg.ends_with("</svg>"));
            assert_eq!(series_drawn(&svg, None), 1);
            assert!(texts(&svg).iter().any(|t| t == "one"));
            assert!(!svg.contains("NaN"));

            let zeros = vec![
                (
                    "zero".to_owned(),
                    vec![(0.0, 0.0), (1.0, -3.0), (10.0, 0.0)],
                ),
                ("same".to_owned(), vec![(3.0, 7.0), (4.0, 7.0)]),
            ];
            let svg = svg_plot("zeros", "y", &zeros, log_y).unwrap();
            assert_eq!(series_drawn(&svg, None), 2);
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
            server_bytes_per_lock: None,
            leftovers: 0,
            all_lost_ms: 12.0,
            server_end_lost_ms: None,
            server_end_ms: None,
            server_end_requests: None,
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
                "scale_client_memory.svg",
                "scale_acquisitions.svg",
                "scale_server_memory.svg",
                "summary.md"
            ]
        );
        for path in &written {
            assert!(path.is_file(), "{} missing", path.display());
        }
        let memory = fs::read_to_string(out.join("scale_client_memory.svg")).unwrap();
        assert_eq!(series_drawn(&memory, None), 1);
        assert!(
            texts(&memory)
                .iter()
                .any(|t| t == "locks held at once (log scale)")
        );
        // Redis says nothing of its memory in this data: the plot says so.
        let server = fs::read_to_string(out.join("scale_server_memory.svg")).unwrap();
        assert!(texts(&server).iter().any(|t| t == "no data"));

        let wakeups = fs::read_to_string(out.join("wakeups.svg")).unwrap();
        // zk-recipe keeps no count: five lines, not six.
        assert_eq!(series_drawn(&wakeups, None), 5);
        assert!(!wakeups.contains("zk-recipe"));
        let throughput = fs::read_to_string(out.join("throughput.svg")).unwrap();
        assert_eq!(series_drawn(&throughput, None), 6);
        let legend = texts(&throughput);
        for name in [
            "zk-single",
            "zk-children",
            "zk-predecessor",
            "zk-recipe",
            "redis-pubsub",
            "redis-queue",
        ] {
            assert!(legend.iter().any(|t| t == name), "{name} not in the legend");
        }
        for (file, y_title) in [
            ("throughput.svg", "grants per second (log scale)"),
            ("wakeups.svg", "wake-ups per handoff (log scale)"),
            ("handoff_p50.svg", "median handoff (µs)"),
        ] {
            let svg = fs::read_to_string(out.join(file)).unwrap();
            let texts = texts(&svg);
            assert!(texts.iter().any(|t| t == y_title), "{file}: {texts:?}");
            assert!(texts.iter().any(|t| t == "contenders N (log scale)"));
        }

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
        // Every p99 is 3× its median: no tail is named.
        assert!(!summary.contains("p99 handoff is more than"));
        assert!(!summary.contains("; p99 "));
        assert!(summary.contains("## Scale"));
    }

    #[test]
    fn findings_name_a_p99_beyond_ten_times_the_median() {
        let with_p99 = |strategy: &str, n: usize, p50: f64, p99: f64| {
            let mut m = measurement(strategy, n, 1000.0, p50, Some(1.0));
            m.handoff_p99_us = p99;
            m
        };
        let ms = vec![
            with_p99("zk-predecessor", 1, 500.0, 1500.0),
            with_p99("zk-recipe", 1, 520.0, 1000.0),
            with_p99("zk-predecessor", 10, 900.0, 90_000.0),
            with_p99("zk-recipe", 10, 1000.0, 2000.0),
            // Exactly 10× is not beyond it.
            with_p99("zk-recipe", 50, 1000.0, 10_000.0),
            with_p99("zk-predecessor", 50, 800.0, 1200.0),
            // Nor is a row without a median.
            with_p99("redis-queue", 10, 0.0, 5000.0),
            with_p99("redis-pubsub", 10, 300.0, 3500.0),
            with_p99("redis-pubsub", 100, 310.0, 31_500.0),
        ];
        let found = findings(&ms);
        let tails: Vec<&String> = found
            .iter()
            .filter(|line| line.contains("p99 handoff is more than"))
            .collect();
        assert_eq!(
            tails,
            [
                "zk-predecessor p99 handoff is more than 10× its median: 100× at N = 10 \
                 (90000 µs vs 900 µs).",
                "redis-pubsub p99 handoff is more than 10× its median: 11.7× at N = 10 \
                 (3500 µs vs 300 µs), 102× at N = 100 (31500 µs vs 310 µs).",
            ],
            "{found:#?}"
        );
        // Against the peer, the p99s are given where either side's tail is wide, and only
        // there.
        assert!(
            found.contains(
                &"At N = 10, zk-predecessor against zk-recipe: median handoff 900 µs vs 1000 µs \
              (0.90×); p99 90000 µs vs 2000 µs; throughput 1000 vs 1000 grants/s."
                    .to_owned()
            )
        );
        for n in [1, 50] {
            let line = found
                .iter()
                .find(|line| {
                    line.contains(&format!("N = {n}), zk-predecessor against"))
                        || line.starts_with(&format!("At N = {n}, zk-predecessor against"))
                })
                .unwrap();
            assert!(!line.contains("p99"), "{line}");
        }
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
