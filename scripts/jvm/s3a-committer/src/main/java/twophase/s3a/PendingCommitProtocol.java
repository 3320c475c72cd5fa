package twophase.s3a;

import java.io.IOException;
import java.io.UncheckedIOException;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.mapreduce.OutputCommitter;
import org.apache.hadoop.mapreduce.TaskAttemptContext;
import org.apache.spark.internal.io.FileNameSpec;
import org.apache.spark.internal.io.HadoopMapReduceCommitProtocol;

import org.apache.hadoop.mapreduce.JobContext;
import org.apache.spark.internal.io.FileCommitProtocol;

import scala.Option;
import scala.collection.immutable.Seq;

/**
 * Spark commit protocol for twophase's native path on s3a:// (spark.sql.sources.commitProtocolClass):
 * the committer is {@link PendingMagicCommitter}, task files go to its magic work path, and every file
 * is named as twophase's S3 sink names its objects,
 * part-&lt;token&gt;-&lt;batch&gt;-&lt;task&gt;-&lt;attempt&gt;-&lt;seq&gt;.&lt;ext&gt; (Hadoop options
 * twophase.s3a.file.prefix = "part-&lt;token&gt;-&lt;batch&gt;-" and twophase.s3a.attempt), so each pending
 * upload's key proves which sink and batch own it. The job commit records how many tasks Spark committed
 * (the pendingsets twophase must find).
 */
public class PendingCommitProtocol extends HadoopMapReduceCommitProtocol {
  private static final long serialVersionUID = 1L;
  public static final String FILE_PREFIX = "twophase.s3a.file.prefix";
  public static final String ATTEMPT = "twophase.s3a.attempt";
  private static final java.util.regex.Pattern SUFFIX = java.util.regex.Pattern.compile("^[.-]c(\\d{3,})(\\.[a-z0-9.]+)$");

  private final String jobIdentifier;
  private final String destination;
  private transient PendingMagicCommitter pending;

  public PendingCommitProtocol(String jobId, String path, boolean dynamicPartitionOverwrite) {
    super(jobId, path, dynamicPartitionOverwrite);
    if (dynamicPartitionOverwrite) {
      throw new UnsupportedOperationException(
          "twophase's native path on s3a:// appends: dynamic partition overwrite is not supported");
    }
    this.jobIdentifier = jobId;
    this.destination = path;
  }

  @Override
  public OutputCommitter setupCommitter(TaskAttemptContext context) {
    try {
      pending = new PendingMagicCommitter(new Path(destination), context);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    return pending;
  }

  @Override
  public String newTaskTempFile(TaskAttemptContext context, Option<String> dir, FileNameSpec spec) {
    Path work = pending.getWorkPath();
    Path parent = dir.isDefined() ? new Path(work, dir.get()) : work;
    return new Path(parent, getFilename(context, spec)).toString();
  }

  @Override
  public String newTaskTempFileAbsPath(TaskAttemptContext context, String absoluteDir, FileNameSpec spec) {
    throw new UnsupportedOperationException(
        "twophase's native path on s3a:// does not write to absolute (custom partition) locations");
  }

  @Override
  public String getFilename(TaskAttemptContext context, FileNameSpec spec) {
    Configuration conf = context.getConfiguration();
    String prefix = conf.get(FILE_PREFIX);
    String attempt = conf.get(ATTEMPT);
    if (prefix == null || prefix.isEmpty() || attempt == null || attempt.isEmpty()) {
      throw new IllegalStateException(FILE_PREFIX + " and " + ATTEMPT + " are not set: this protocol is twophase's own");
    }
    java.util.regex.Matcher m = SUFFIX.matcher(spec.suffix());
    if (!spec.prefix().isEmpty() || !m.matches()) {
      throw new IllegalStateException("twophase: Spark asked for a file name with prefix '" + spec.prefix()
          + "' and suffix '" + spec.suffix() + "', which twophase's S3 names cannot carry");
    }
    int split = context.getTaskAttemptID().getTaskID().getId();
    return prefix + String.format("%05d", split) + "-" + attempt + "-" + m.group(1) + m.group(2);
  }

  @Override
  public void commitJob(JobContext context, Seq<FileCommitProtocol.TaskCommitMessage> taskCommits) {
    pending.expectTasks(taskCommits.size());
    super.commitJob(context, taskCommits);
  }
}
