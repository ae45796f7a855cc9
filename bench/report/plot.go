package main

import (
	"fmt"
	"image/color"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// series is one line of a plot.
type series struct {
	name string
	pts  plotter.XYs
	dash bool
}

var palette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
}

// savePlot draws the series as lines and writes name.svg (or .png) under s.plots; it
// returns the markdown that shows it.
func (s *setup) savePlot(name, title, xlabel, ylabel string, lines []series) (string, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xlabel
	p.Y.Label.Text = ylabel
	p.Y.Min = 0
	p.Add(plotter.NewGrid())
	for i, l := range lines {
		ln, err := plotter.NewLine(l.pts)
		if err != nil {
			return "", fmt.Errorf("plot %s: %w", name, err)
		}
		ln.Color = palette[i%len(palette)]
		ln.Width = vg.Points(1.5)
		if l.dash {
			ln.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		p.Add(ln)
		p.Legend.Add(l.name, ln)
	}
	p.Legend.Top = true
	// Room above the lines for the legend.
	top := 0.0
	for _, l := range lines {
		for _, pt := range l.pts {
			top = max(top, pt.Y)
		}
	}
	p.Y.Max = 1.35 * max(top, 1)
	file := name + "." + s.format
	if err := p.Save(7*vg.Inch, 3*vg.Inch, filepath.Join(s.plots, file)); err != nil {
		return "", err
	}
	return fmt.Sprintf("![%s](%s)\n", title, filepath.ToSlash(filepath.Join(s.plotLink, file))), nil
}
