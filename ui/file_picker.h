// A path field with a Browse button that says at once whether the file exists.
#pragma once

#include <QWidget>

class QLabel;
class QLineEdit;

namespace td::ui {

class FilePicker : public QWidget {
    Q_OBJECT
  public:
    // `filter` as for QFileDialog ("IDX files (*.gz *-ubyte)"); optional fields accept empty text.
    FilePicker(const QString& filter, bool optional, QWidget* parent = nullptr);
    // A folder instead of a file (an image folder source).
    static FilePicker* folder(bool optional, QWidget* parent = nullptr);

    QString path() const;
    void setPath(const QString& path);  // does not emit pathEdited
    bool isValid() const;
    QString problem() const;  // empty when valid
    QLineEdit* lineEdit() const { return edit_; }

  signals:
    void pathEdited(const QString& path);

  private:
    void validate();

    QString filter_;
    bool optional_;
    bool folder_ = false;
    QLineEdit* edit_;
    QLabel* status_;
};

}  // namespace td::ui
