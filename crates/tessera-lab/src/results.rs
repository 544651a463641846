//! Results: a [`Table`] (CSV and Markdown), a [`Figure`] (PNG), and [`write_outputs`], which
//! writes an experiment's four files `DIR/NAME.{json,csv,md,png}`.
//!
//! Text in plots is drawn with DejaVu Sans, embedded in the binary (the `dejavu` crate), by
//! plotters' pure-Rust `ab_glyph` renderer: no fontconfig, no system fonts.

use crate::LabError;
use plotters::coord::Shift;
use plotters::prelude::*;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// One of an experiment's targets, and whether the data meets it.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    /// What is wanted.
    pub goal: String,
    /// What was measured.
    pub measured: String,
    /// Met or not; `None` when the data cannot tell.
    pub pass: Option<bool>,
}

/// The font family plots use; registered once from the embedded font.
const FONT: &str = "sans-serif";
/// Line colors, in order: distinguishable, and not red-green only.
const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// One value of a table.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    /// Text.
    Text(String),
    /// A whole number.
    Int(i64),
    /// A number shown with `decimals` digits after the point.
    Float {
        /// The value.
        value: f64,
        /// Digits after the point.
        decimals: usize,
    },
    /// Nothing (not applicable).
    Empty,
}

impl Cell {
    /// Text.
    pub fn text(text: impl Into<String>) -> Cell {
        Cell::Text(text.into())
    }

    /// A number with `decimals` digits after the point.
    pub fn float(value: f64, decimals: usize) -> Cell {
        Cell::Float { value, decimals }
    }

    /// How the value reads.
    pub fn render(&self) -> String {
        match self {
            Cell::Text(text) => text.clone(),
            Cell::Int(n) => n.to_string(),
            Cell::Float { value, decimals } => format!("{value:.decimals$}"),
            Cell::Empty => String::new(),
        }
    }

    fn is_number(&self) -> bool {
        matches!(self, Cell::Int(_) | Cell::Float { .. } | Cell::Empty)
    }
}

impl From<&str> for Cell {
    fn from(text: &str) -> Cell {
        Cell::Text(text.into())
    }
}

impl From<String> for Cell {
    fn from(text: String) -> Cell {
        Cell::Text(text)
    }
}

impl From<i64> for Cell {
    fn from(n: i64) -> Cell {
        Cell::Int(n)
    }
}

impl From<u32> for Cell {
    fn from(n: u32) -> Cell {
        Cell::Int(i64::from(n))
    }
}

impl<T: Into<Cell>> From<Option<T>> for Cell {
    fn from(value: Option<T>) -> Cell {
        value.map_or(Cell::Empty, Into::into)
    }
}

/// Rows under named columns.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Table {
    /// Column names.
    pub columns: Vec<String>,
    /// Rows, each as long as `columns`.
    pub rows: Vec<Vec<Cell>>,
}

impl Table {
    /// An empty table with these columns.
    pub fn new(columns: &[&str]) -> Table {
        Table {
            columns: columns.iter().map(|c| c.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Add a row; it must have a cell per column.
    pub fn push(&mut self, row: Vec<Cell>) {
        assert_eq!(row.len(), self.columns.len(), "a cell per column");
        self.rows.push(row);
    }

    /// RFC 4180 CSV: a header line, then a line per row.
    pub fn to_csv(&self) -> String {
        let line = |cells: Vec<String>| {
            let quoted: Vec<String> = cells.iter().map(|c| csv_field(c)).collect();
            quoted.join(",") + "\n"
        };
        let mut out = line(self.columns.clone());
        for row in &self.rows {
            out += &line(row.iter().map(Cell::render).collect());
        }
        out
    }

    /// A Markdown table; columns of numbers are right-aligned.
    pub fn to_markdown(&self) -> String {
        let escape = |text: &str| text.replace('|', "\\|").replace('\n', " ");
        let mut out = format!(
            "| {} |\n",
            self.columns
                .iter()
                .map(|c| escape(c))
                .collect::<Vec<_>>()
                .join(" | ")
        );
        let aligns: Vec<&str> = (0..self.columns.len())
            .map(|i| {
                let numeric = !self.rows.is_empty() && self.rows.iter().all(|r| r[i].is_number());
                if numeric {
                    "---:"
                } else {
                    "---"
                }
            })
            .collect();
        out += &format!("|{}|\n", aligns.join("|"));
        for row in &self.rows {
            let cells: Vec<String> = row.iter().map(|c| escape(&c.render())).collect();
            out += &format!("| {} |\n", cells.join(" | "));
        }
        out
    }
}

fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

/// A plot made of panels in rows; the panels of a row share its width.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// Title over everything.
    pub title: String,
    /// Rows of panels, top to bottom.
    pub rows: Vec<Vec<Panel>>,
    /// Width of the whole figure, in pixels.
    pub width_px: u32,
    /// Height of one row, in pixels.
    pub row_height_px: u32,
}

/// One chart of a figure.
#[derive(Debug, Clone, PartialEq)]
pub enum Panel {
    /// Lines over a numeric x axis.
    Lines(LinePanel),
    /// Groups of bars.
    Bars(BarPanel),
}

/// Lines over a numeric x axis.
#[derive(Debug, Clone, PartialEq)]
pub struct LinePanel {
    /// Title over the panel.
    pub title: String,
    /// Label of the x axis.
    pub x_label: String,
    /// Label of the y axis.
    pub y_label: String,
    /// Span of the x axis.
    pub x_range: (f64, f64),
    /// How x values are spaced.
    pub x_scale: XScale,
    /// Span of the y axis.
    pub y_range: (f64, f64),
    /// The lines.
    pub series: Vec<LineSeries>,
}

/// How a line panel spaces its x values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum XScale {
    /// Evenly.
    #[default]
    Linear,
    /// Each doubling one step, for sweeps over 1, 2, 4, 8, ... (values must be positive).
    Log2,
}

impl XScale {
    /// Where value `x` sits on the axis.
    pub fn position(self, x: f64) -> f64 {
        match self {
            XScale::Linear => x,
            XScale::Log2 => x.log2(),
        }
    }

    /// The label of the tick at axis position `at`, which shows whole steps only.
    fn label(self, at: f64, whole: bool) -> String {
        match (self, whole) {
            (XScale::Linear, true) => format!("{at:.0}"),
            (XScale::Linear, false) => format!("{at}"),
            (XScale::Log2, _) if (at - at.round()).abs() < 1e-6 => {
                format!("{}", 2f64.powf(at.round()))
            }
            (XScale::Log2, _) => String::new(),
        }
    }
}

/// One line.
#[derive(Debug, Clone, PartialEq)]
pub struct LineSeries {
    /// Legend text.
    pub label: String,
    /// Index into the palette.
    pub color: usize,
    /// Dashed instead of solid, without markers (a reference line).
    pub dashed: bool,
    /// Points, in x order.
    pub points: Vec<(f64, f64)>,
}

/// Bars in groups: each group has one bar per series.
#[derive(Debug, Clone, PartialEq)]
pub struct BarPanel {
    /// Title over the panel.
    pub title: String,
    /// Label of the y axis.
    pub y_label: String,
    /// Span of the y axis.
    pub y_range: (f64, f64),
    /// Names of the groups, left to right.
    pub groups: Vec<String>,
    /// The series: one bar in each group (none where the value is missing).
    pub series: Vec<BarSeries>,
}

/// One bar per group.
#[derive(Debug, Clone, PartialEq)]
pub struct BarSeries {
    /// Legend text.
    pub label: String,
    /// Index into the palette.
    pub color: usize,
    /// A value per group.
    pub values: Vec<Option<f64>>,
}

fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_err()
        {
            // The embedded font is a known-good TrueType file; this cannot happen short of
            // a broken build, and then plots would have no text, which the tests catch.
            eprintln!("lab: the embedded font did not load");
        }
    });
}

/// Draw `figure` into a PNG at `path`.
pub fn render_png(figure: &Figure, path: &Path) -> Result<(), LabError> {
    register_font();
    let plot_error = |e: &dyn std::fmt::Display| LabError::Plot {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let rows = figure.rows.len().max(1) as u32;
    let size = (figure.width_px, 50 + rows * figure.row_height_px);
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_error(&e))?;
    // plotters' ab_glyph text sits a little high: a margin keeps the title's top inside.
    let body = root
        .margin(12, 0, 0, 0)
        .titled(&figure.title, (FONT, 26).into_font())
        .map_err(|e| plot_error(&e))?;
    let row_areas = body.split_evenly((figure.rows.len().max(1), 1));
    for (row, area) in figure.rows.iter().zip(row_areas) {
        let panel_areas = area.split_evenly((1, row.len().max(1)));
        for (panel, area) in row.iter().zip(panel_areas) {
            match panel {
                Panel::Lines(p) => draw_lines(p, &area),
                Panel::Bars(p) => draw_bars(p, &area),
            }
            .map_err(|e| plot_error(&e))?;
        }
    }
    root.present().map_err(|e| plot_error(&e))?;
    Ok(())
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;
type DrawResult = Result<(), Box<dyn std::error::Error>>;

fn draw_lines(panel: &LinePanel, area: &Area<'_>) -> DrawResult {
    let area = area.margin(8, 8, 8, 8);
    let scale = panel.x_scale;
    let x_range = (
        scale.position(panel.x_range.0),
        scale.position(panel.x_range.1),
    );
    let mut chart = ChartBuilder::on(&area)
        .caption(&panel.title, (FONT, 18))
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(x_range.0..x_range.1, panel.y_range.0..panel.y_range.1)?;
    let whole_x = x_range.1 - x_range.0 <= 20.0;
    chart
        .configure_mesh()
        .x_desc(&panel.x_label)
        .y_desc(&panel.y_label)
        .x_labels(if whole_x {
            (x_range.1 - x_range.0) as usize + 1
        } else {
            10
        })
        .x_label_formatter(&|x| scale.label(*x, whole_x))
        .y_label_formatter(&|y| y_label(*y, panel.y_range))
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    let mut labelled = false;
    for series in &panel.series {
        let color = PALETTE[series.color % PALETTE.len()];
        let style = color.stroke_width(2);
        let points: Vec<(f64, f64)> = series
            .points
            .iter()
            .map(|&(x, y)| (scale.position(x), y))
            .collect();
        let legend_color = color;
        if series.dashed {
            chart
                .draw_series(DashedLineSeries::new(points, 8, 5, style))?
                .label(&series.label)
                .legend(move |(x, y)| {
                    plotters::element::DashedPathElement::new(
                        vec![(x, y), (x + 20, y)],
                        5,
                        3,
                        legend_color.stroke_width(2),
                    )
                });
        } else {
            chart
                .draw_series(plotters::series::LineSeries::new(points, style).point_size(3))?
                .label(&series.label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], legend_color.stroke_width(2))
                });
        }
        labelled |= !series.label.is_empty();
    }
    if labelled {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(200, 200, 200))
            .label_font((FONT, 12))
            .draw()?;
    }
    Ok(())
}

/// A y tick: shares and rates with a decimal, counts (a range over 20) without.
fn y_label(y: f64, range: (f64, f64)) -> String {
    if range.1 - range.0 > 20.0 {
        format!("{y:.0}")
    } else {
        format!("{y:.1}")
    }
}

fn draw_bars(panel: &BarPanel, area: &Area<'_>) -> DrawResult {
    let area = area.margin(8, 8, 8, 8);
    let groups = panel.groups.len().max(1);
    let mut chart = ChartBuilder::on(&area)
        .caption(&panel.title, (FONT, 18))
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..groups as f64, panel.y_range.0..panel.y_range.1)?;
    let names = panel.groups.clone();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(&panel.y_label)
        .x_labels(groups * 2 + 1)
        .x_label_formatter(&move |x| {
            // Name each group at its middle (x = i + 0.5) only.
            let i = x.floor();
            if (x - i - 0.5).abs() < 1e-6 {
                names.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| format!("{y:.1}"))
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    let bars = panel.series.len().max(1) as f64;
    let bar_width = 0.8 / bars;
    for (s, series) in panel.series.iter().enumerate() {
        let color = PALETTE[series.color % PALETTE.len()];
        let rects = series.values.iter().enumerate().filter_map(|(g, value)| {
            let value = (*value)?;
            let left = g as f64 + 0.1 + s as f64 * bar_width;
            Some(Rectangle::new(
                [(left, panel.y_range.0), (left + bar_width * 0.92, value)],
                color.filled(),
            ))
        });
        chart
            .draw_series(rects)?
            .label(&series.label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled()));
        // Each bar's value over it.
        let values = series.values.iter().enumerate().filter_map(|(g, value)| {
            let value = (*value)?;
            let middle = g as f64 + 0.1 + (s as f64 + 0.46) * bar_width;
            Some(
                EmptyElement::at((middle, value))
                    + Text::new(format!("{value:.2}"), (-12, -16), (FONT, 12).into_font()),
            )
        });
        chart.draw_series(values)?;
    }
    if !panel.series.is_empty() {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(200, 200, 200))
            .label_font((FONT, 12))
            .draw()?;
    }
    Ok(())
}

/// Write `DIR/NAME.json` (the report), `DIR/NAME.csv` and `DIR/NAME.md` (the table, the
/// Markdown under `preamble`) and `DIR/NAME.png` (the figure). Returns the four paths.
pub fn write_outputs<R: Serialize>(
    dir: &Path,
    name: &str,
    report: &R,
    table: &Table,
    preamble: &str,
    figure: &Figure,
) -> Result<Vec<PathBuf>, LabError> {
    std::fs::create_dir_all(dir).map_err(LabError::io(format!("create {}", dir.display())))?;
    let path = |ext: &str| dir.join(format!("{name}.{ext}"));
    let write = |p: &PathBuf, text: String| {
        std::fs::write(p, text).map_err(LabError::io(format!("write {}", p.display())))
    };
    let json = serde_json::to_string_pretty(report).expect("reports serialize") + "\n";
    write(&path("json"), json)?;
    write(&path("csv"), table.to_csv())?;
    let mut markdown = preamble.trim_end().to_string();
    if !markdown.is_empty() {
        markdown += "\n\n";
    }
    markdown += &table.to_markdown();
    write(&path("md"), markdown)?;
    render_png(figure, &path("png"))?;
    Ok(["json", "csv", "md", "png"].map(path).to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Table {
        let mut t = Table::new(&["scheme", "servers", "MB/s", "note"]);
        t.push(vec![
            "raid5".into(),
            3u32.into(),
            Cell::float(12.3456, 2),
            Cell::Empty,
        ]);
        t.push(vec![
            "raid4".into(),
            4u32.into(),
            Cell::float(7.0, 2),
            "parity, \"lost\"".into(),
        ]);
        t
    }

    #[test]
    fn csv_has_a_header_and_quotes_what_needs_it() {
        assert_eq!(
            table().to_csv(),
            "scheme,servers,MB/s,note\nraid5,3,12.35,\nraid4,4,7.00,\"parity, \"\"lost\"\"\"\n"
        );
    }

    #[test]
    fn markdown_right_aligns_numbers_and_escapes_pipes() {
        let mut t = table();
        t.push(vec![
            "a|b".into(),
            5u32.into(),
            Cell::float(1.0, 1),
            Cell::Empty,
        ]);
        let md = t.to_markdown();
        let lines: Vec<&str> = md.lines().collect();
        assert_eq!(lines[0], "| scheme | servers | MB/s | note |");
        assert_eq!(lines[1], "|---|---:|---:|---|");
        assert_eq!(lines[2], "| raid5 | 3 | 12.35 |  |");
        assert_eq!(lines[4], "| a\\|b | 5 | 1.0 |  |");
    }

    #[test]
    #[should_panic(expected = "a cell per column")]
    fn rows_must_fill_every_column() {
        table().push(vec!["raid0".into()]);
    }

    fn figure() -> Figure {
        let line = |label: &str, color, dashed, y: f64| LineSeries {
            label: label.into(),
            color,
            dashed,
            points: (1..=8)
                .map(|w| (w as f64, y * (1.0 - 1.0 / (w as f64 + 1.0))))
                .collect(),
        };
        Figure {
            title: "swift-window (test)".into(),
            rows: vec![
                vec![Panel::Lines(LinePanel {
                    title: "raid5 read".into(),
                    x_label: "window (datagrams)".into(),
                    y_label: "fraction of link rate".into(),
                    x_range: (1.0, 8.0),
                    x_scale: XScale::Linear,
                    y_range: (0.0, 1.05),
                    series: vec![
                        line("3 servers", 0, false, 1.0),
                        line("3 servers, TCP", 0, true, 0.9),
                    ],
                })],
                vec![Panel::Bars(BarPanel {
                    title: "degraded".into(),
                    y_label: "fraction of link rate".into(),
                    y_range: (0.0, 1.05),
                    groups: vec!["raid5/3".into(), "raid4/3".into()],
                    series: vec![BarSeries {
                        label: "read".into(),
                        color: 1,
                        values: vec![Some(0.8), None],
                    }],
                })],
            ],
            width_px: 600,
            row_height_px: 300,
        }
    }

    #[test]
    fn outputs_are_four_files_and_the_png_has_text_and_lines() {
        let dir = tempfile::tempdir().unwrap();
        let report = serde_json::json!({"experiment": "test", "rows": 2});
        let paths =
            write_outputs(dir.path(), "test", &report, &table(), "# Test", &figure()).unwrap();
        let names: Vec<String> = paths
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["test.json", "test.csv", "test.md", "test.png"]);
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&paths[0]).unwrap()).unwrap();
        assert_eq!(json["rows"], 2);
        assert!(std::fs::read_to_string(&paths[2])
            .unwrap()
            .starts_with("# Test\n\n| scheme"));
        let png = std::fs::read(&paths[3]).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        // Width and height from the IHDR chunk.
        let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
        let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
        assert_eq!((width, height), (600, 50 + 2 * 300));
    }

    #[test]
    fn log2_axes_step_once_per_doubling() {
        assert_eq!(XScale::Log2.position(64.0), 6.0);
        assert_eq!(XScale::Linear.position(64.0), 64.0);
        assert_eq!(XScale::Log2.label(4.0, true), "16");
        assert_eq!(XScale::Log2.label(4.5, true), "");
        assert_eq!(XScale::Linear.label(3.0, true), "3");
        assert_eq!(y_label(0.5, (0.0, 1.05)), "0.5");
        assert_eq!(y_label(14000.0, (0.0, 15000.0)), "14000");
    }

    #[test]
    fn text_is_drawn_with_the_embedded_font() {
        // The title alone on a blank figure must darken some pixels: proof the font loaded.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.png");
        let figure = Figure {
            title: "Tessera".into(),
            rows: vec![],
            width_px: 200,
            row_height_px: 50,
        };
        render_png(&figure, &path).unwrap();
        let mut pixels = vec![0u8; 200 * 100 * 3];
        {
            // Draw the same into memory to count dark pixels without a PNG decoder.
            register_font();
            let root = BitMapBackend::with_buffer(&mut pixels, (200, 100)).into_drawing_area();
            root.fill(&WHITE).unwrap();
            root.titled("Tessera", (FONT, 26).into_font()).unwrap();
            root.present().unwrap();
        }
        let dark = pixels.chunks(3).filter(|p| p[0] < 128).count();
        assert!(dark > 50, "only {dark} dark pixels: no text drawn");
    }
}
