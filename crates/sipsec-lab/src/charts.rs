//! The report's charts, drawn with plotters into inline SVG strings. They know nothing of
//! records or suites: the report hands them labelled numbers. Bars run horizontally, one
//! row per configuration with its name on the left, so twenty configurations stay legible
//! without rotated labels.

use anyhow::Result;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

/// Colours by index: the model's blocks (one colour each, the wake-up last in grey), then
/// lines of a multi-series chart.
pub(crate) const PALETTE: [RGBColor; 19] = rgb([
    0x1f77b4, 0x6baed6, 0x08519c, 0x3182bd, 0xff7f0e, 0x2ca02c, 0xd62728, 0x9467bd, 0x8c564b,
    0xe377c2, 0x7f7f7f, 0xbcbd22, 0x17becf, 0xffd700, 0x393b79, 0xad494a, 0x31a354, 0xfd8d3c,
    0xc7c7c7,
]);

/// Colours from `0xRRGGBB` values.
const fn rgb<const N: usize>(hex: [u32; N]) -> [RGBColor; N] {
    let mut out = [RGBColor(0, 0, 0); N];
    let mut i = 0;
    while i < N {
        let h = hex[i];
        out[i] = RGBColor((h >> 16) as u8, (h >> 8) as u8, h as u8);
        i += 1;
    }
    out
}

type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

const WIDTH: u32 = 1000;
const LABELS_PX: u32 = 190;
const LEGEND_PX: u32 = 210;
const ROW_PX: u32 = 24;

/// A chart of one horizontal bar row per label (the first at the top), the x axis from 0 to
/// `x_max`, and a legend of coloured boxes (or lines, where the flag is set) on the right.
/// `draw` draws into it; row `i` spans y from `n - i - 1` to `n - i`.
fn hbars(
    caption: &str,
    x_desc: &str,
    labels: &[String],
    x_max: f64,
    legend: &[(String, RGBColor, bool)],
    draw: impl FnOnce(&mut Chart<'_, '_>) -> Result<()>,
) -> Result<String> {
    let n = labels.len().max(1);
    let height = 90 + ROW_PX * n as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let (area, key) = root.split_horizontally(WIDTH - LEGEND_PX);
        let mut c = ChartBuilder::on(&area)
            .caption(caption, ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(40)
            .y_label_area_size(LABELS_PX)
            .build_cartesian_2d(0f64..x_max.max(1e-9), 0f64..n as f64)?;
        let names = labels.to_vec();
        c.configure_mesh()
            .disable_y_mesh()
            .y_labels(2 * n + 1)
            .y_label_formatter(&|y| {
                let from_top = n as f64 - y;
                let i = from_top.floor() as usize;
                if (from_top - from_top.floor() - 0.5).abs() < 0.01 && i < names.len() {
                    names[i].clone()
                } else {
                    String::new()
                }
            })
            .y_label_style(("sans-serif", 12))
            .x_desc(x_desc)
            .draw()?;
        draw(&mut c)?;
        let mut y = 40;
        for (name, color, line) in legend {
            if *line {
                key.draw(&PathElement::new(
                    vec![(5, y + 6), (20, y + 6)],
                    color.stroke_width(3),
                ))?;
            } else {
                key.draw(&Rectangle::new([(5, y), (20, y + 12)], color.filled()))?;
            }
            key.draw(&Text::new(
                name.clone(),
                (26, y),
                ("sans-serif", 12).into_font(),
            ))?;
            y += 20;
        }
        root.present()?;
    }
    Ok(svg)
}

/// The y span of row `i` of `n`, inset so bars have a gap between them.
fn row_span(i: usize, n: usize) -> (f64, f64) {
    let top = (n - i) as f64;
    (top - 0.85, top - 0.15)
}

/// One configuration's bar in a stacked cost chart.
pub struct CostBar {
    /// The configuration's name, written beside its bar.
    pub label: String,
    /// (block index into `blocks`, µs) in stacking order.
    pub parts: Vec<(usize, f64)>,
    /// The measured value (a black tick) and its 95% interval (a whisker).
    pub measured: f64,
    /// The (low, high) ends of the measured value's 95% interval, in µs; none for a baseline.
    pub interval: Option<(f64, f64)>,
}

/// CPU per operation by configuration: the model's blocks stacked, the measured median as
/// a black tick with its interval.
pub fn cost(caption: &str, blocks: &[&str], bars: &[CostBar]) -> Result<String> {
    let x_max = bars
        .iter()
        .flat_map(|b| {
            [
                b.measured,
                b.interval.map_or(0.0, |i| i.1),
                b.parts.iter().map(|p| p.1).sum(),
            ]
        })
        .fold(1.0, f64::max)
        * 1.1;
    let mut legend: Vec<(String, RGBColor, bool)> = blocks
        .iter()
        .enumerate()
        .map(|(i, b)| (b.to_string(), PALETTE[i % PALETTE.len()], false))
        .collect();
    legend.push(("measured (median, 95% CI)".into(), BLACK, true));
    let labels: Vec<String> = bars.iter().map(|b| b.label.clone()).collect();
    hbars(caption, "µs per operation", &labels, x_max, &legend, |c| {
        let n = bars.len();
        for (i, bar) in bars.iter().enumerate() {
            let (y0, y1) = row_span(i, n);
            let mut x = 0.0;
            for &(b, us) in &bar.parts {
                if us > 0.0 {
                    c.draw_series(std::iter::once(Rectangle::new(
                        [(x, y0), (x + us, y1)],
                        PALETTE[b % PALETTE.len()].filled(),
                    )))?;
                    x += us;
                }
            }
            c.draw_series(std::iter::once(PathElement::new(
                vec![(bar.measured, y0 - 0.08), (bar.measured, y1 + 0.08)],
                BLACK.stroke_width(3),
            )))?;
            if let Some((lo, hi)) = bar.interval {
                let mid = (y0 + y1) / 2.0;
                c.draw_series(std::iter::once(PathElement::new(
                    vec![(lo, mid), (hi, mid)],
                    BLACK.stroke_width(1),
                )))?;
            }
        }
        Ok(())
    })
}

/// One configuration's value in a plain bar chart.
pub struct Bar {
    /// The configuration's name, written beside its bar.
    pub label: String,
    /// The bar's length, in the unit the chart's x axis names.
    pub value: f64,
    /// A whisker, e.g. a 95% interval.
    pub interval: Option<(f64, f64)>,
}

/// One bar per label, optionally with a whisker, in one colour.
pub fn bars(caption: &str, x_desc: &str, values: &[Bar]) -> Result<String> {
    let x_max = values
        .iter()
        .map(|v| v.interval.map_or(v.value, |i| i.1.max(v.value)))
        .fold(1e-9, f64::max)
        * 1.1;
    let labels: Vec<String> = values.iter().map(|v| v.label.clone()).collect();
    hbars(caption, x_desc, &labels, x_max, &[], |c| {
        let n = values.len();
        for (
            i,
            Bar {
                value: v, interval, ..
            },
        ) in values.iter().enumerate()
        {
            let (y0, y1) = row_span(i, n);
            c.draw_series(std::iter::once(Rectangle::new(
                [(0.0, y0), (*v, y1)],
                PALETTE[0].filled(),
            )))?;
            if let Some((lo, hi)) = interval {
                let mid = (y0 + y1) / 2.0;
                c.draw_series(std::iter::once(PathElement::new(
                    vec![(*lo, mid), (*hi, mid)],
                    BLACK.stroke_width(1),
                )))?;
            }
        }
        Ok(())
    })
}

/// Lines of (x, y) points, one per label, with a legend; `log_x` for latency axes.
pub fn lines(
    caption: &str,
    (x_desc, y_desc): (&str, &str),
    series: &[(String, Vec<(f64, f64)>)],
    log_x: bool,
    y_max: Option<f64>,
) -> Result<Option<String>> {
    let series: Vec<&(String, Vec<(f64, f64)>)> = series.iter().filter(|s| s.1.len() > 1).collect();
    if series.is_empty() {
        return Ok(None);
    }
    let xs = series.iter().flat_map(|s| s.1.iter().map(|p| p.0));
    let x_max = xs.clone().fold(f64::MIN, f64::max) * 1.1;
    let x_min = xs.fold(f64::MAX, f64::min);
    let y_top = y_max.unwrap_or_else(|| {
        series
            .iter()
            .flat_map(|s| s.1.iter().map(|p| p.1))
            .fold(1e-9, f64::max)
            * 1.1
    });
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, 400)).into_drawing_area();
        root.fill(&WHITE)?;
        let builder = |area| {
            let mut b = ChartBuilder::on(area);
            b.caption(caption, ("sans-serif", 16))
                .margin(8)
                .x_label_area_size(40)
                .y_label_area_size(60);
            b
        };
        let style = |i: usize| {
            let color = PALETTE[i % PALETTE.len()];
            (color, color.stroke_width(1 + (i / PALETTE.len()) as u32))
        };
        let corner = if log_x {
            SeriesLabelPosition::LowerRight
        } else {
            SeriesLabelPosition::UpperLeft
        };
        macro_rules! plot {
            ($c:expr, $map:expr) => {{
                let mut c = $c;
                c.configure_mesh().x_desc(x_desc).y_desc(y_desc).draw()?;
                for (i, (label, points)) in series.iter().map(|s| (&s.0, &s.1)).enumerate() {
                    let (color, stroke) = style(i);
                    let pts: Vec<(f64, f64)> = points.iter().map($map).collect();
                    c.draw_series(LineSeries::new(pts.clone(), stroke))?
                        .label(label.as_str())
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], color));
                    c.draw_series(pts.into_iter().map(|p| Circle::new(p, 2, color.filled())))?;
                }
                c.configure_series_labels()
                    .position(corner.clone())
                    .label_font(("sans-serif", 11))
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .draw()?;
            }};
        }
        if log_x {
            let lo = x_min.max(1e-3);
            let c = builder(&root)
                .build_cartesian_2d((lo..x_max.max(lo * 10.0)).log_scale(), 0f64..y_top)?;
            plot!(c, |p: &(f64, f64)| (p.0.max(lo), p.1));
        } else {
            let c = builder(&root).build_cartesian_2d(0f64..x_max, 0f64..y_top)?;
            plot!(c, |p: &(f64, f64)| *p);
        }
        root.present()?;
    }
    Ok(Some(svg))
}
