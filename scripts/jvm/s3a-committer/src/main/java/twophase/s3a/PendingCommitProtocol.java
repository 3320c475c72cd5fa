package twophase.s3a;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ConcurrentHashMap;

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
 * upload's key proves which sink and batch own it.
 *
 * <p>Each committed task returns its pending uploads (a pendingset's JSON) in its TaskCommitMessage; the job
 * commit (on the driver) checks one message per committed task and keeps their list in this JVM under the
 * job's S3A committer UUID, where twophase's driver takes it ({@link #take}). Nothing of it is written to S3:
 * twophase records the uploads in its own log (PENDING) before it completes any; uploads of a job whose list
 * was never taken are pending uploads of the sink's token, which twophase's sweep aborts.
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
  public FileCommitProtocol.TaskCommitMessage commitTask(TaskAttemptContext taskContext) {
    super.commitTask(taskContext);  // Spark's commit coordination, then PendingMagicCommitter.commitTask
    try {
      return new FileCommitProtocol.TaskCommitMessage(pending.takeCommitted());
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  /** The job's pending uploads by S3A committer UUID, from the job commit until twophase takes them. */
  private static final ConcurrentHashMap<String, String> COMMITTED = new ConcurrentHashMap<>();

  /**
   * The pending uploads of the committed job whose S3A committer UUID is {@code uuid} (a JSON array of
   * pendingsets, one per committed task), removed from this JVM; null if no such job committed here.
   */
  public static String take(String uuid) {
    return COMMITTED.remove(uuid);
  }

  /**
   * Completes nothing, writes nothing: checks one pendingset message per task Spark committed and keeps
   * their list for {@link #take}. (Not HadoopMapReduceCommitProtocol's: no staging folder to delete, no
   * absolute-path files to move, both refused at the task.)
   */
  @Override
  public void commitJob(JobContext context, Seq<FileCommitProtocol.TaskCommitMessage> taskCommits) {
    String uuid = pending.getUUID();
    List<String> sets = new ArrayList<>();
    scala.collection.Iterator<FileCommitProtocol.TaskCommitMessage> it = taskCommits.iterator();
    while (it.hasNext()) {
      Object obj = it.next().obj();
      if (!(obj instanceof String) || !((String) obj).startsWith("{")) {
        throw new IllegalStateException("twophase: job " + uuid + ": a task's commit message is not a pendingset ("
            + (obj == null ? "null" : obj.getClass().getName()) + ")");
      }
      sets.add((String) obj);
    }
    COMMITTED.put(uuid, "[" + String.join(",", sets) + "]");
  }
}
