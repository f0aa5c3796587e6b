#include "ui/app_icon.h"

#include <QImageReader>
#include <QLinearGradient>
#include <QPainter>
#include <QPainterPath>
#include <QPixmap>

namespace td::ui {

namespace {

QPixmap paintIcon(int size) {
    QPixmap pm(size, size);
    pm.fill(Qt::transparent);
    QPainter p(&pm);
    p.setRenderHint(QPainter::Antialiasing);
    p.scale(size / 128.0, size / 128.0);
    QLinearGradient bg(0, 0, 0, 128);
    bg.setColorAt(0, QColor("#2b5fa8"));
    bg.setColorAt(1, QColor("#173b70"));
    p.setPen(Qt::NoPen);
    p.setBrush(bg);
    p.drawRoundedRect(QRectF(6, 6, 116, 116), 22, 22);
    QPen curve(QColor("#ffb347"), 6, Qt::SolidLine, Qt::RoundCap, Qt::RoundJoin);
    p.setPen(curve);
    const QPointF pts[] = {{16, 104}, {36, 92}, {56, 86}, {76, 70}, {96, 58}, {112, 30}};
    p.drawPolyline(pts, 6);
    p.setPen(QPen(QColor(207, 224, 255, 216), 2));
    const QPointF in[] = {{32, 34}, {32, 62}}, hidden[] = {{64, 26}, {64, 50}, {64, 74}};
    const QPointF out(96, 48);
    for (auto a : in)
        for (auto b : hidden) p.drawLine(a, b);
    for (auto b : hidden) p.drawLine(b, out);
    p.setPen(Qt::NoPen);
    p.setBrush(Qt::white);
    for (auto a : in) p.drawEllipse(a, 8, 8);
    for (auto b : hidden) p.drawEllipse(b, 8, 8);
    p.setBrush(QColor("#ffb347"));
    p.drawEllipse(out, 9, 9);
    return pm;
}

}  // namespace

QIcon appIcon() {
    if (QImageReader::supportedImageFormats().contains("svg"))
        return QIcon(":/icons/traindeck.svg");
    QIcon icon;
    for (int s : {16, 24, 32, 48, 64, 128, 256}) icon.addPixmap(paintIcon(s));
    return icon;
}

}  // namespace td::ui
