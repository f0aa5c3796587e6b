#include "ui/file_picker.h"

#include <QFileDialog>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QToolButton>
#include <QVBoxLayout>

namespace td::ui {

FilePicker::FilePicker(const QString& filter, bool optional, QWidget* parent)
    : QWidget(parent), filter_(filter), optional_(optional) {
    edit_ = new QLineEdit;
    edit_->setPlaceholderText(optional ? tr("optional") : tr("required"));
    auto* browse = new QToolButton;
    browse->setText(tr("Browse…"));
    status_ = new QLabel;
    status_->setWordWrap(true);
    status_->setStyleSheet("color: #b00020;");
    auto* row = new QHBoxLayout;
    row->setContentsMargins(0, 0, 0, 0);
    row->addWidget(edit_, 1);
    row->addWidget(browse);
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->setSpacing(1);
    layout->addLayout(row);
    layout->addWidget(status_);
    connect(edit_, &QLineEdit::textEdited, this, [this](const QString& text) {
        validate();
        emit pathEdited(text.trimmed());
    });
    connect(browse, &QToolButton::clicked, this, [this] {
        QString start =
            edit_->text().isEmpty() ? QString() : QFileInfo(edit_->text()).absolutePath();
        QString p =
            folder_ ? QFileDialog::getExistingDirectory(this, tr("Choose a folder"), edit_->text())
                    : QFileDialog::getOpenFileName(this, tr("Choose a file"), start, filter_);
        if (p.isEmpty()) return;
        edit_->setText(p);
        validate();
        emit pathEdited(p);
    });
    validate();
}

FilePicker* FilePicker::folder(bool optional, QWidget* parent) {
    auto* p = new FilePicker(QString(), optional, parent);
    p->folder_ = true;
    p->validate();
    return p;
}

QString FilePicker::path() const {
    return edit_->text().trimmed();
}

void FilePicker::setPath(const QString& path) {
    edit_->setText(path);
    validate();
}

QString FilePicker::problem() const {
    const QString p = path();
    if (p.isEmpty())
        return optional_ ? QString()
               : folder_ ? tr("A folder is required here.")
                         : tr("A file is required here.");
    QFileInfo fi(p);
    if (folder_) {
        if (!fi.exists()) return tr("Folder not found: %1").arg(p);
        if (!fi.isDir()) return tr("Not a folder: %1").arg(p);
        return {};
    }
    if (!fi.exists()) return tr("File not found: %1").arg(p);
    if (!fi.isFile()) return tr("Not a file: %1").arg(p);
    if (!fi.isReadable()) return tr("File is not readable: %1").arg(p);
    return {};
}

bool FilePicker::isValid() const {
    return problem().isEmpty();
}

void FilePicker::validate() {
    QString why = problem();
    status_->setText(why);
    status_->setVisible(!why.isEmpty());
    edit_->setStyleSheet(why.isEmpty() ? QString() : QString("border: 1px solid #b00020;"));
}

}  // namespace td::ui
