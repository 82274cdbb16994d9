//! Grouped bar panels with min–max whiskers, drawn with plotters' SVG
//! backend. Both subcommands describe their data as [`Panel`]s and let this
//! module do the geometry.

use anyhow::{Context as _, Result, anyhow};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Fill opacity of a bar whose value is only a floor (every rep was limited
/// by the sender, not by the relay).
const FLOOR_ALPHA: f64 = 0.35;

/// Colours for contenders, in order of first appearance (the matplotlib
/// "tab10" start: distinct, and readable for the common colour-blindnesses).
const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// The colour of the `index`-th contender.
pub fn colour(index: usize) -> RGBColor {
    PALETTE[index % PALETTE.len()]
}

/// One bar: a central value with a whisker from `min` to `max`.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    pub value: f64,
    pub min: f64,
    pub max: f64,
    /// The value is a lower bound: drawn pale, and its label gets a "≥".
    pub floor: bool,
    /// A short second label line under the value (e.g. "2/3 SL").
    pub note: Option<String>,
}

/// One contender: one bar (or a gap) per group.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub colour: RGBColor,
    pub bars: Vec<Option<Bar>>,
}

/// A panel: groups along x, one bar per series in each group.
#[derive(Debug, Clone)]
pub struct Panel {
    pub title: String,
    pub x_desc: String,
    pub y_desc: String,
    pub groups: Vec<String>,
    pub series: Vec<Series>,
    /// Formats a value for the label above its bar.
    pub value_label: fn(f64) -> String,
    /// Draw the legend inside this panel.
    pub legend: bool,
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// Width of one group on the x axis, in axis units.
const UNIT: i32 = 1000;

/// Turns a plotters drawing error (whose error types are generic over the
/// backend) into an `anyhow` error.
fn draw_err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("drawing the plot: {e}")
}

/// Draws `panel` into `area`.
pub fn draw_panel(area: &Area<'_>, panel: &Panel) -> Result<()> {
    let n_groups = panel.groups.len();
    let n_series = panel.series.len();
    if n_groups == 0 || n_series == 0 {
        return Err(anyhow!("panel {:?} has no data to draw", panel.title));
    }
    let top = panel
        .series
        .iter()
        .flat_map(|s| s.bars.iter().flatten())
        .map(|b| b.max.max(b.value))
        .fold(0.0_f64, f64::max);
    if !top.is_finite() || top <= 0.0 {
        return Err(anyhow!(
            "panel {:?}: values must be finite and positive (largest is {top})",
            panel.title
        ));
    }
    // Headroom for the value labels and, in the legend panel, the legend.
    let headroom = if panel.legend { 1.42 } else { 1.18 };
    let y_top = top * headroom;

    // x is in thousandths of a group: group i spans [i * UNIT, (i + 1) * UNIT]
    // and its label sits on the key point at its centre. (Integers because
    // plotters has no label formatter for an f64 axis with key points.)
    let n_groups_i32 = i32::try_from(n_groups).context("too many groups")?;
    let n_series_i32 = i32::try_from(n_series).context("too many series")?;
    let key_points: Vec<i32> = (0..n_groups_i32).map(|i| i * UNIT + UNIT / 2).collect();
    let x_range = (0..n_groups_i32 * UNIT).with_key_points(key_points);
    let groups = panel.groups.clone();

    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(x_range, 0.0..y_top)
        .map_err(draw_err)?;

    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc(panel.x_desc.as_str())
        .y_desc(panel.y_desc.as_str())
        .x_label_formatter(&|x: &i32| {
            usize::try_from(x.div_euclid(UNIT))
                .ok()
                .and_then(|i| groups.get(i))
                .cloned()
                .unwrap_or_default()
        })
        .y_label_formatter(&|y: &f64| format!("{y:.0}"))
        .x_label_style(("sans-serif", 15))
        .y_label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .light_line_style(WHITE.mix(0.0))
        .bold_line_style(BLACK.mix(0.12))
        .draw()
        .map_err(draw_err)?;

    // Geometry: 80 % of a group holds the bars, 10 % margin each side.
    let slot = UNIT * 8 / 10 / n_series_i32;
    let bar_width = slot * 86 / 100;
    let cap = bar_width * 22 / 100;
    let label_gap = y_top * 0.012;

    for (k, series) in panel.series.iter().enumerate() {
        let colour = series.colour;
        let k = i32::try_from(k).context("too many series")?;
        let placed: Vec<(i32, &Bar)> = (0..n_groups_i32)
            .zip(&series.bars)
            .filter_map(|(i, b)| b.as_ref().map(|b| (i * UNIT + UNIT / 10 + k * slot, b)))
            .collect();

        let fills = placed.iter().map(|&(x0, b)| {
            let style = if b.floor {
                colour.mix(FLOOR_ALPHA).filled()
            } else {
                colour.filled()
            };
            Rectangle::new([(x0, 0.0), (x0 + bar_width, b.value)], style)
        });
        chart
            .draw_series(fills)
            .map_err(draw_err)?
            .label(series.name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], colour.filled()));

        // Outline, so a pale (floor) bar still reads as this contender's.
        let outlines = placed.iter().map(|&(x0, b)| {
            Rectangle::new(
                [(x0, 0.0), (x0 + bar_width, b.value)],
                colour.stroke_width(if b.floor { 2 } else { 1 }),
            )
        });
        chart.draw_series(outlines).map_err(draw_err)?;

        let whisker = BLACK.stroke_width(1);
        for &(x0, b) in &placed {
            let xc = x0 + bar_width / 2;
            if b.max > b.min {
                chart
                    .draw_series([
                        PathElement::new(vec![(xc, b.min), (xc, b.max)], whisker),
                        PathElement::new(vec![(xc - cap, b.min), (xc + cap, b.min)], whisker),
                        PathElement::new(vec![(xc - cap, b.max), (xc + cap, b.max)], whisker),
                    ])
                    .map_err(draw_err)?;
            }
            let label_y = b.max.max(b.value) + label_gap;
            let value = format!(
                "{}{}",
                if b.floor { "≥" } else { "" },
                (panel.value_label)(b.value)
            );
            let value_style = ("sans-serif", 13)
                .into_font()
                .color(&BLACK)
                .pos(Pos::new(HPos::Center, VPos::Bottom));
            let mut texts = vec![Text::new(value, (xc, label_y), value_style)];
            if let Some(note) = &b.note {
                // The note goes above the value, in the contender's colour.
                let note_style = ("sans-serif", 11)
                    .into_font()
                    .color(&colour)
                    .pos(Pos::new(HPos::Center, VPos::Bottom));
                texts.push(Text::new(
                    note.clone(),
                    (xc, label_y + y_top * 0.045),
                    note_style,
                ));
            }
            chart.draw_series(texts).map_err(draw_err)?;
        }
    }

    if panel.legend {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .margin(8)
            .label_font(("sans-serif", 15))
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK.mix(0.4))
            .draw()
            .map_err(draw_err)?;
    }
    Ok(())
}

/// Renders a figure: a title line, the panels side by side, and caption
/// lines underneath. Returns the SVG text.
pub fn render(
    size: (u32, u32),
    title: &str,
    panels: &[Panel],
    caption: &[String],
) -> Result<String> {
    if panels.is_empty() {
        return Err(anyhow!("nothing to draw"));
    }
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let root = root.titled(title, ("sans-serif", 24)).map_err(draw_err)?;
        let caption_height = 10 + 20 * u32::try_from(caption.len()).unwrap_or(u32::MAX / 40);
        let (_, height) = root.dim_in_pixel();
        let (body, foot) = root.split_vertically(height.saturating_sub(caption_height));
        let n_panels = u32::try_from(panels.len()).context("too many panels")?;
        let (width, _) = body.dim_in_pixel();
        let areas = body.split_evenly((1, n_panels.min(width).max(1) as usize));
        for (area, panel) in areas.iter().zip(panels) {
            draw_panel(area, panel)?;
        }
        let caption_style = ("sans-serif", 14)
            .into_font()
            .color(&BLACK.mix(0.75))
            .pos(Pos::new(HPos::Left, VPos::Top));
        for (i, line) in caption.iter().enumerate() {
            let y = 4 + 20 * i32::try_from(i).unwrap_or(i32::MAX / 40);
            foot.draw(&Text::new(line.as_str(), (16, y), caption_style.clone()))
                .map_err(draw_err)?;
        }
        root.present().map_err(draw_err)?;
    }
    Ok(svg)
}

/// Writes `svg` to `path`, creating the parent directory.
pub fn write_file(path: &std::path::Path, contents: &str) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the output directory {}", dir.display()))?;
    }
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}
